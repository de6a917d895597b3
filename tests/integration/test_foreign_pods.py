"""A tenant's pods dressed as a cluster's instances (kwok profile, where they run as Running and Ready):
one with the instance labels and `role=primary` and no owner, one that also forges a controller reference
to the cluster's StatefulSet. Neither is ever an instance: the status does not list them, neither is the
current primary (they sort before the real pods, where the status would pick them first), and the operator
says once that it ignores each (orchestration/instance_pods.py). Taken for instances, they would get the
operator's psql over pod exec and its Patroni calls with the cluster's credentials."""

from __future__ import annotations

from typing import Any

from harness.kube import apply, get_json, make_namespace
from harness.kwok_status import cluster_obj
from harness.objects import cluster
from harness.operator_process import OperatorEnv, start_operator
from harness.waiting import wait_until

NAME = "fp-db"
# Sorted before the real pods (fp-db-0, fp-db-1): the status's choice among ready primaries is by name.
IMPOSTER, FORGED = "a-imposter", "a-forged"


def tenant_pod(
    namespace: str, name: str, labels: dict[str, str], owner: dict[str, Any] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {**labels, "role": "primary"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    container = {"name": "postgres", "image": "registry.invalid/postgres:16"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container]}}


def pod_ready(kube: Any, ns: str, name: str) -> bool:
    pod = get_json(kube, "pod", name, "-n", ns)
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def status_of(kube: Any, ns: str) -> dict[str, Any]:
    return dict(cluster_obj(kube, ns, NAME).get("status") or {})


def test_pods_carrying_the_instance_labels_are_never_instances(operator_env: OperatorEnv) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "foreign")
    op = start_operator(operator_env, "foreign-pods", "--namespace", ns, "--resync-seconds", "30")
    try:
        op.wait_leader()
        apply(kube, cluster(NAME, ns, replicas=2))
        real = [f"{NAME}-0", f"{NAME}-1"]
        wait_until("the instances to run", lambda: all(pod_ready(kube, ns, p) for p in real), timeout=120)
        for pod in real:  # replicas for now: no primary among the real pods
            kube.kubectl("label", "pod", pod, "-n", ns, "role=replica", "--overwrite")
        labels = dict(get_json(kube, "pod", real[0], "-n", ns)["metadata"]["labels"])
        labels.pop("role", None)
        sts = get_json(kube, "statefulset", NAME, "-n", ns)
        forged_ref = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": NAME,
                      "uid": sts["metadata"]["uid"], "controller": True}  # fmt: skip
        apply(kube, tenant_pod(ns, IMPOSTER, labels, None))
        apply(kube, tenant_pod(ns, FORGED, labels, forged_ref))
        for pod in (IMPOSTER, FORGED):
            wait_until(f"the tenant's pod {pod} to run", lambda p=pod: pod_ready(kube, ns, p), timeout=120)

        def instances() -> list[str]:
            return sorted(str(i["name"]) for i in status_of(kube, ns).get("instances") or [])

        # The status after the tenant's pods came: the real pods are listed, ready, the others not.
        def settled() -> bool:
            status = status_of(kube, ns)
            ready = sorted(str(i["name"]) for i in status.get("instances") or [] if i.get("ready"))
            return ready == real and status.get("currentPrimary", "") == ""

        wait_until("the status to list only the real instances, with no primary", settled, timeout=60)
        # The real primary comes: it is the current primary, not the tenant's ready "primaries".
        kube.kubectl("label", "pod", real[0], "-n", ns, "role=primary", "--overwrite")
        wait_until("fp-db-0 as the current primary",
                   lambda: status_of(kube, ns).get("currentPrimary") == real[0], timeout=60)  # fmt: skip
        assert instances() == real
        log = op.log_text()
        for pod in (IMPOSTER, FORGED):
            assert f"pod {pod} carries the cluster's labels but is not controlled by its StatefulSet" in log
        assert op.alive(), log[-3000:]
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        op.stop()
