"""Every container the operator creates meets the `restricted` Pod Security Standard, read from the
builders' output: the instances' pod template, the pooler's, and the major upgrade's ephemeral container.
(The API server's own check, on a namespace enforcing `restricted`, is in
tests/integration/test_least_privilege.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from harness.objects import cluster_model as cluster
from pg_operator.orchestration.major_upgrade_state import Phase, UpgradeState, staging, staging_container
from pg_operator.specs.pooler import children as pooler_children
from pg_operator.specs.statefulset import statefulset

# The volume types `restricted` admits.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # fmt: skip


def container_violations(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """What `restricted` refuses in one container, given its pod's spec (pod-level settings count)."""
    sc, pod_sc = container.get("securityContext") or {}, pod.get("securityContext") or {}
    name, out = container["name"], []
    if sc.get("privileged"):
        out.append(f"{name}: privileged")
    if sc.get("allowPrivilegeEscalation") is not False:
        out.append(f"{name}: allowPrivilegeEscalation is not false")
    capabilities = sc.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or ()):
        out.append(f"{name}: capabilities do not drop ALL")
    if set(capabilities.get("add") or ()) - {"NET_BIND_SERVICE"}:
        out.append(f"{name}: capabilities added")
    if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        out.append(f"{name}: runAsNonRoot is not true")
    if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
        out.append(f"{name}: runs as root")
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"{name}: seccomp profile {seccomp!r}")
    if any(p.get("hostPort") for p in container.get("ports") or ()):
        out.append(f"{name}: hostPort")
    return out


def pod_violations(pod: dict[str, Any]) -> list[str]:
    out = [f"pod: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    for volume in pod.get("volumes") or ():
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {sorted(kinds)}")
    containers = [*pod.get("initContainers", ()), *pod["containers"], *pod.get("ephemeralContainers", ())]
    for container in containers:
        out += container_violations(pod, container)
    return out


def test_the_checker_sees_what_restricted_refuses() -> None:
    pod = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
           "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
           "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False}}]}  # fmt: skip
    assert pod_violations(pod) == ["volume h: ['hostPath']", "c: capabilities do not drop ALL"]


S3 = {"bucket": "backups", "endpointURL": "https://s3.example.com", "credentials": {"secretName": "s3-creds"}}


@pytest.mark.parametrize("spec", [{}, {"pooler": {"instances": 2}}, {"backup": {"s3": S3}}])
def test_the_instance_pods_are_restricted(spec: dict[str, Any]) -> None:
    pod = statefulset(cluster(**spec))["spec"]["template"]["spec"]
    assert pod_violations(pod) == []


def test_the_pooler_pods_are_restricted() -> None:
    objects = pooler_children(cluster(pooler={"instances": 2}), "localhost/pg-operator/operator:1")
    deployments = [c for c in objects if c["kind"] == "Deployment"]
    assert len(deployments) == 1
    for deployment in deployments:
        assert pod_violations(deployment["spec"]["template"]["spec"]) == []


def test_the_major_upgrades_ephemeral_container_is_restricted() -> None:
    """Added to an instance pod, the staging container must not make that pod fail the level."""
    pod = statefulset(cluster())["spec"]["template"]["spec"]
    for image in (None, "registry.example/pg:17"):  # the operator's image, and one of spec.image
        upgrade = UpgradeState("16", "17", Phase.CHECKING, image=image)
        staged = {**pod, "ephemeralContainers": [staging_container(staging(upgrade))]}
        assert pod_violations(staged) == []
