"""Storage growth on the kwok profile: a larger spec.storage patches every data PVC (the StatefulSet's
claim templates are immutable and stay as they were), a resync afterwards writes nothing, and a class
that does not allow expansion turns the refused patch into a lasting Degraded condition rather than a
retry loop (or a condition flapping between Degraded and Healthy).

What kwok cannot show: the volume actually growing (no CSI resizer runs, so status.capacity stays);
that part belongs to the full profile."""

from __future__ import annotations

import time
import uuid
from typing import Any

from harness.kube import apply, condition, events_for, get_json, make_namespace
from harness.kwok_status import cluster_obj, wait_ready
from harness.objects import CLUSTER_LABEL, cluster
from harness.objects import storage_class as storage_class_body
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec, reconcile_passes
from harness.waiting import wait_until

RESYNC = 10.0
OPERATOR = OperatorSpec("storage", ("--resync-seconds", str(RESYNC)))


def storage_class(kube: Any, expandable: bool) -> str:
    name = f"pgop-grow-{uuid.uuid4().hex[:6]}"
    apply(kube, storage_class_body(name, expandable=expandable))  # served by the harness's PvProvisioner
    return name


def requested(kube: Any, ns: str, name: str) -> dict[str, str]:
    items = get_json(kube, "pvc", "-n", ns, "-l", f"{CLUSTER_LABEL}={name}")["items"]
    return {p["metadata"]["name"]: p["spec"]["resources"]["requests"]["storage"] for p in items}


def grow(kube: Any, ns: str, name: str, storage: str) -> None:
    kube.kubectl(
        "patch", "pgc", name, "-n", ns, "--type=merge", "-p", f'{{"spec":{{"storage":"{storage}"}}}}'
    )


def test_growing_storage_patches_every_pvc_and_then_writes_nothing(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "grow")
    klass = storage_class(kube, expandable=True)
    try:
        apply(kube, cluster("grow-db", ns, replicas=2, storageClassName=klass))
        wait_ready(kube, ns, "grow-db", 2, timeout=180)
        assert requested(kube, ns, "grow-db") == {"data-grow-db-0": "1Gi", "data-grow-db-1": "1Gi"}

        grow(kube, ns, "grow-db", "3Gi")
        wait_until(
            "both PVCs to request 3Gi",
            lambda: set(requested(kube, ns, "grow-db").values()) == {"3Gi"},
            timeout=60,
        )
        sts = get_json(kube, "statefulset", "grow-db", "-n", ns)
        templates = sts["spec"]["volumeClaimTemplates"]
        assert [t["spec"]["resources"]["requests"]["storage"] for t in templates] == ["1Gi"]
        obj = cluster_obj(kube, ns, "grow-db")
        assert condition(obj, "Degraded").get("status") == "False", obj["status"]

        # Grown once: the next passes see the larger requests and patch nothing again.
        mark = operator_env.audit.settled(namespace=ns)  # the growth's own follow-up writes are done
        before = reconcile_passes(operator)
        time.sleep(RESYNC * 1.1 + 3)
        assert reconcile_passes(operator) > before, "no reconcile ran during the resync window"
        # This cluster's namespace: the clusters earlier test modules left in terminating namespaces are
        # still being torn down around it (the full suite saw 9 Service patches there, refused).
        writes = operator_env.audit.writes_since(mark, namespace=ns)
        assert writes == {}, f"a resync after the growth wrote: {dict(writes)}"
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")
        kube.kubectl("delete", "storageclass", klass, "--wait=false")


def test_a_class_without_expansion_degrades_with_the_refusal(
    operator_env: OperatorEnv, operator: OperatorProcess
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "nogrow")
    klass = storage_class(kube, expandable=False)
    try:
        apply(kube, cluster("fixed-db", ns, replicas=1, storageClassName=klass))
        wait_ready(kube, ns, "fixed-db", 1, timeout=180)
        grow(kube, ns, "fixed-db", "2Gi")

        def degraded() -> dict[str, Any]:
            cond = condition(cluster_obj(kube, ns, "fixed-db"), "Degraded")
            return cond if cond.get("reason") == "StorageResizeRefused" else {}

        cond = wait_until("Degraded: StorageResizeRefused", degraded, timeout=60)
        assert cond["status"] == "True" and "data-fixed-db-0" in cond["message"], cond
        assert requested(kube, ns, "fixed-db") == {"data-fixed-db-0": "1Gi"}
        # It stays Degraded through the passes that follow (they do not repeat the refused patch at
        # once, and must not report Healthy meanwhile): one Warning, no Recovered.
        before = reconcile_passes(operator)
        time.sleep(RESYNC * 1.1 + 3)
        assert reconcile_passes(operator) > before, "no reconcile ran during the resync window"
        still = condition(cluster_obj(kube, ns, "fixed-db"), "Degraded")
        assert still.get("reason") == "StorageResizeRefused", still
        events = events_for(kube, ns, "fixed-db")
        assert [e["reason"] for e in events if e["type"] == "Warning"] == ["StorageResizeRefused"], events
        assert "Recovered" not in [e["reason"] for e in events]
        assert f"reconcile of {ns}/fixed-db failed" not in operator.log_text(), "it retried as if transient"
    finally:
        kube.kubectl("delete", "namespace", ns, "--wait=false")
        kube.kubectl("delete", "storageclass", klass, "--wait=false")
