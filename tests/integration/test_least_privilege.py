"""Least privilege on the real API server (kwok profile): what the operator's ServiceAccount may do to pods,
what its pods may be, and what image a tenant may make it run.

- The admission policies of deploy/operator/admission-policy.yaml: impersonating the operator's
  ServiceAccount (`kubectl --as`), an exec into a tenant's pod and an ephemeral container in it are
  refused by the policy (its message), while those into an instance pod and a pooler pod of a cluster
  are admitted: on kwok no kubelet answers an exec, so an admitted exec fails later, with another error.
- Pod Security: in a namespace enforcing `restricted`, a cluster with a pooler gets its instance and
  pooler pods (each was admitted), and the API server admits the major upgrade's ephemeral container as
  the operator builds it.
- The image allow-list: a cluster naming an image outside it gets no StatefulSet, a Degraded
  `ImageNotAllowed` condition naming spec.image and a Warning Event; a running cluster switched to such
  an image keeps its StatefulSet as it was, and resumes once the image is allowed again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from harness.kube import apply, condition, events_for, get_json, get_or_none, make_namespace
from harness.objects import cluster
from harness.operator_process import OPERATOR_USER, OperatorEnv, OperatorProcess, start_operator
from harness.paths import REPO
from harness.waiting import wait_until

pytestmark = pytest.mark.integration

POLICIES = REPO / "deploy" / "operator" / "admission-policy.yaml"
EXEC_REFUSED = "pg-operator may exec only into"
EPHEMERAL_REFUSED = "pg-operator may add ephemeral containers only to"
FOREIGN_IMAGE = "registry.invalid/miner/postgres:16"


@pytest.fixture(scope="module")
def policies(operator_env: OperatorEnv) -> Iterator[None]:
    """The install's admission policies, applied as `kubectl apply -k deploy/` applies them; removed
    afterwards (other modules' operators run under the same ServiceAccount)."""
    kube = operator_env.kube
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(POLICIES))
    try:
        yield
    finally:
        kube.kubectl("delete", "-f", str(POLICIES), "--ignore-not-found")


@pytest.fixture(scope="module")
def namespaces(operator_env: OperatorEnv) -> Iterator[dict[str, str]]:
    kube = operator_env.kube
    names = {"tenant": make_namespace(kube, "lp-tenant"), "restricted": make_namespace(kube, "lp-restricted"),
             "images": make_namespace(kube, "lp-images")}  # fmt: skip
    kube.kubectl("label", "namespace", names["restricted"], "pod-security.kubernetes.io/enforce=restricted",
                 "pod-security.kubernetes.io/enforce-version=latest")  # fmt: skip
    try:
        yield names
    finally:
        for ns in names.values():
            kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(operator_env: OperatorEnv, namespaces: dict[str, str]) -> Iterator[OperatorProcess]:
    watched = [a for ns in namespaces.values() for a in ("--namespace", ns)]
    proc = start_operator(operator_env, "least-privilege", *watched, "--resync-seconds", "30")
    try:
        proc.wait_leader()
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_text()[-3000:]


def pods_of(kube: Any, ns: str, selector: str) -> list[dict[str, Any]]:
    return list(get_json(kube, "pods", "-n", ns, "-l", selector)["items"])


def running_cluster(kube: Any, ns: str, name: str, **spec: Any) -> tuple[str, str]:
    """A cluster with a pooler, its first instance pod and one pooler pod (both exist, so both were
    admitted) once they run."""
    apply(kube, cluster(name, ns, replicas=1, pooler={"instances": 1}, **spec))
    instance = f"{name}-0"
    wait_until(f"{ns}/{instance}", lambda: get_or_none(kube, "pod", instance, "-n", ns), timeout=120)
    poolers = wait_until(f"a pooler pod of {ns}/{name}",
                         lambda: pods_of(kube, ns, f"db.example.com/pooler={name}"), timeout=120)  # fmt: skip
    return instance, str(poolers[0]["metadata"]["name"])


def tenant_pod(kube: Any, ns: str, name: str, labels: dict[str, str] | None = None) -> str:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {"app": "tenant"}}
    container = {"name": "postgres", "image": "registry.invalid/app:1",
                 "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                     "runAsNonRoot": True, "runAsUser": 1000,
                                     "seccompProfile": {"type": "RuntimeDefault"}}}  # fmt: skip
    # A volume named as the instances' data volume, so the upgrade's ephemeral container is a valid
    # addition to it (the API server validates the pod before admission policies run).
    spec = {"containers": [container], "volumes": [{"name": "data", "emptyDir": {}}]}
    apply(kube, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    return name


def exec_as_operator(kube: Any, ns: str, pod: str, container: str) -> str:
    """`kubectl exec` as the operator's ServiceAccount: its error output (an exec never succeeds on kwok)."""
    res = kube.kubectl("exec", pod, "-n", ns, "-c", container, f"--as={OPERATOR_USER}", "--", "true",
                       check=False, timeout=60)  # fmt: skip
    assert res.returncode != 0, f"an exec into {ns}/{pod} succeeded on kwok: {res.stdout}"
    return str(res.stderr)


def staging_body(name: str) -> dict[str, Any]:
    from pg_operator.orchestration.major_upgrade_state import Phase, UpgradeState, staging, staging_container

    return {**staging_container(staging(UpgradeState("16", "17", Phase.CHECKING))), "name": name}


def add_ephemeral(kube: Any, ns: str, pod: str, container: dict[str, Any]) -> Any:
    """As an administrator, with kubectl."""
    patch = json.dumps({"spec": {"ephemeralContainers": [container]}})
    return kube.kubectl("patch", "pod", pod, "-n", ns, "--subresource=ephemeralcontainers",
                        "--type=strategic", "-p", patch, check=False)  # fmt: skip


def add_ephemeral_as_operator(env: OperatorEnv, ns: str, pod: str, container: dict[str, Any]) -> str:
    """The request the major upgrade sends (a strategic merge PATCH of pods/ephemeralcontainers, nothing
    read first), with the operator's ServiceAccount token: "" when admitted, else the refusal."""
    client = Client(KubeConfig.from_file(env.kubeconfig), field_manager="pg-operator")
    try:
        client.patch(Pod.Ephemeralcontainers, pod, {"spec": {"ephemeralContainers": [container]}},
                     namespace=ns, patch_type=PatchType.STRATEGIC)  # fmt: skip
    except ApiError as exc:
        return str(exc.status.message)
    finally:
        client.close()
    return ""


def test_the_operator_execs_and_adds_containers_only_in_its_own_pods(
    operator_env: OperatorEnv, policies: None, namespaces: dict[str, str], operator: OperatorProcess
) -> None:
    kube, ns = operator_env.kube, namespaces["tenant"]
    instance, pooler = running_cluster(kube, ns, "lp-db")
    labels = dict(get_json(kube, "pod", instance, "-n", ns)["metadata"]["labels"])
    tenant = tenant_pod(kube, ns, "tenant-app")
    dressed = tenant_pod(kube, ns, "dressed-up", labels)  # the instance labels, no StatefulSet behind it

    # Ephemeral containers: refused in a tenant's pod and in one wearing the instance labels, admitted in
    # an instance pod (the body the operator builds for a major upgrade).
    for pod in (tenant, dressed):
        refusal = add_ephemeral_as_operator(operator_env, ns, pod, staging_body("stage-17-11"))
        assert EPHEMERAL_REFUSED in refusal, f"{pod}: {refusal or 'admitted'}"
        assert not get_json(kube, "pod", pod, "-n", ns)["spec"].get("ephemeralContainers")
    assert add_ephemeral_as_operator(operator_env, ns, instance, staging_body("stage-17-11")) == ""
    added = get_json(kube, "pod", instance, "-n", ns)["spec"]["ephemeralContainers"]
    assert [c["name"] for c in added] == ["stage-17-11"]

    # Exec refused by the policy: a tenant's pod, one wearing the instance labels, and an instance pod's
    # container other than postgres (kubectl itself refuses names the pod does not have).
    for pod, container in ((tenant, "postgres"), (dressed, "postgres"), (instance, "stage-17-11")):
        error = exec_as_operator(kube, ns, pod, container)
        assert EXEC_REFUSED in error, f"exec into {pod}/{container} was not refused by the policy: {error}"
    # Admitted: the instance's postgres container and the pooler's pgbouncer (kwok has no kubelet to
    # answer, so the exec fails after admission, with another message).
    for pod, container in ((instance, "postgres"), (pooler, "pgbouncer")):
        error = exec_as_operator(kube, ns, pod, container)
        assert EXEC_REFUSED not in error and "Forbidden" not in error, f"{pod}: {error}"
    # The policy applies to the operator only: an administrator's exec into the tenant's pod is admitted.
    res = kube.kubectl("exec", tenant, "-n", ns, "-c", "postgres", "--", "true", check=False, timeout=60)
    assert res.returncode != 0 and EXEC_REFUSED not in res.stderr, res.stderr


def test_the_pods_pass_the_restricted_pod_security_level(
    operator_env: OperatorEnv, namespaces: dict[str, str], operator: OperatorProcess
) -> None:
    kube, ns = operator_env.kube, namespaces["restricted"]
    instance, pooler = running_cluster(kube, ns, "psa-db")
    for pod in (instance, pooler):
        assert get_json(kube, "pod", pod, "-n", ns)["metadata"]["name"] == pod
    # The major upgrade's ephemeral container, exactly as the operator builds it, on an instance pod of
    # that namespace (as an administrator: Pod Security alone decides).
    res = add_ephemeral(kube, ns, instance, staging_body("stage-17-11"))
    assert res.returncode == 0, res.stderr
    # The check bites: the same container with a capability added is refused by Pod Security.
    body = staging_body("stage-other")
    body["securityContext"]["capabilities"] = {"add": ["NET_RAW"], "drop": ["ALL"]}
    res = add_ephemeral(kube, ns, instance, body)
    assert res.returncode != 0 and "violates PodSecurity" in res.stderr, res.stderr


def test_an_image_outside_the_allow_list_is_refused(
    operator_env: OperatorEnv, namespaces: dict[str, str], operator: OperatorProcess
) -> None:
    kube, ns = operator_env.kube, namespaces["images"]
    apply(kube, cluster("foreign", ns, replicas=1, image=FOREIGN_IMAGE))

    def refused() -> dict[str, Any]:
        return dict(condition(get_or_none(kube, "pgc", "foreign", "-n", ns), "Degraded"))

    degraded = wait_until("the foreign image refused", lambda: refused().get("reason") == "ImageNotAllowed"
                          and refused(), timeout=60)  # fmt: skip
    assert degraded["status"] == "True" and f"spec.image '{FOREIGN_IMAGE}'" in degraded["message"]
    warnings = [e for e in events_for(kube, ns, "foreign") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["ImageNotAllowed"], warnings
    assert FOREIGN_IMAGE in warnings[0]["message"]
    assert get_or_none(kube, "statefulset", "foreign", "-n", ns) is None
    assert get_or_none(kube, "secret", "foreign-superuser", "-n", ns) is None

    # A running cluster switched to a foreign image keeps what it runs; allowed again, it resumes.
    apply(kube, cluster("switched", ns, replicas=1))
    sts = wait_until("the StatefulSet", lambda: get_or_none(kube, "statefulset", "switched", "-n", ns),
                     timeout=60)  # fmt: skip
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    kube.kubectl("patch", "pgc", "switched", "-n", ns, "--type=merge", "-p",
                 json.dumps({"spec": {"image": FOREIGN_IMAGE}}))  # fmt: skip

    def switched_condition() -> dict[str, Any]:
        return dict(condition(get_json(kube, "pgc", "switched", "-n", ns), "Degraded"))

    wait_until("the switch refused", lambda: switched_condition().get("reason") == "ImageNotAllowed",
               timeout=60)  # fmt: skip
    after = get_json(kube, "statefulset", "switched", "-n", ns)
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert after["metadata"]["generation"] == sts["metadata"]["generation"]
    kube.kubectl("patch", "pgc", "switched", "-n", ns, "--type=json", "-p",
                 json.dumps([{"op": "remove", "path": "/spec/image"}]))  # fmt: skip
    wait_until("the refusal cleared", lambda: switched_condition().get("reason") != "ImageNotAllowed",
               timeout=60)  # fmt: skip
