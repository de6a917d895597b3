"""A stuck cluster says why, on the kwok profile (the real scheduler and volume controller): an instance
no node matches is Degraded `Unschedulable` with the scheduler's message, one whose volume claim nothing
provisions is Degraded `VolumeUnbound` naming the claim and the provisioner it waits for; each with one
Warning Event, and both clear once the node or the volume appears.

What kwok cannot show: the kubelet's own failures (image pulls, crash loops): the full profile's
tests/e2e/test_cluster_stuck.py shows an image that cannot be pulled."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.kube import apply, condition, events_for, get_json, make_namespace
from harness.kwok_status import cluster_obj, wait_ready
from harness.objects import cluster
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.waiting import wait_until

OPERATOR = OperatorSpec("stuck")
ABSENT_PROVISIONER = "provisioner.example.com/absent"


@pytest.fixture
def ns(operator_env: OperatorEnv, operator: OperatorProcess) -> Iterator[str]:
    namespace = make_namespace(operator_env.kube, "stuck")
    yield namespace
    operator_env.kube.kubectl("delete", "namespace", namespace, "--wait=false")


def degraded_with(kube: Any, ns: str, name: str, reason: str) -> dict[str, Any]:
    cond = condition(cluster_obj(kube, ns, name), "Degraded")
    return cond if (cond.get("status"), cond.get("reason")) == ("True", reason) else {}


def warnings(kube: Any, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(kube, ns, name) if e["type"] == "Warning" and e["reason"] == reason]


def test_an_instance_no_node_matches_is_unschedulable_until_a_node_does(
    operator_env: OperatorEnv, ns: str
) -> None:
    kube = operator_env.kube
    key = f"pgop-test/nowhere-{uuid.uuid4().hex[:6]}"
    apply(kube, cluster("far-db", ns, replicas=1, nodeSelector={key: "yes"}))
    cond = wait_until(
        "Degraded Unschedulable", lambda: degraded_with(kube, ns, "far-db", "Unschedulable"), 90
    )
    assert cond["message"].startswith("pod far-db-0 cannot be scheduled: 0/"), cond
    assert "didn't match Pod's node affinity/selector" in cond["message"], cond
    assert len(warnings(kube, ns, "far-db", "Unschedulable")) == 1

    nodes = [n["metadata"]["name"] for n in get_json(kube, "nodes")["items"]]
    node = next(n for n in nodes if "kwok" in n) if any("kwok" in n for n in nodes) else nodes[0]
    kube.kubectl("label", "node", node, f"{key}=yes")
    try:
        wait_ready(kube, ns, "far-db", 1, timeout=120)
        assert condition(cluster_obj(kube, ns, "far-db"), "Degraded").get("status") == "False"
        assert len(warnings(kube, ns, "far-db", "Unschedulable")) == 1
    finally:
        kube.kubectl("label", "node", node, f"{key}-")


def test_a_claim_nothing_provisions_is_volume_unbound_until_a_volume_appears(
    operator_env: OperatorEnv, ns: str
) -> None:
    kube = operator_env.kube
    klass = f"pgop-absent-{uuid.uuid4().hex[:6]}"
    apply(kube, {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": klass},
                 "provisioner": ABSENT_PROVISIONER, "volumeBindingMode": "Immediate"})  # fmt: skip
    try:
        apply(kube, cluster("dry-db", ns, replicas=1, storageClassName=klass))
        cond = wait_until(
            "Degraded VolumeUnbound", lambda: degraded_with(kube, ns, "dry-db", "VolumeUnbound"), 90
        )
        message = cond["message"]
        assert message.startswith("pod dry-db-0 waits for PersistentVolumeClaim data-dry-db-0 to be bound"), (
            cond
        )
        assert f'StorageClass "{klass}", waiting for provisioner "{ABSENT_PROVISIONER}"' in message, cond
        assert "unbound immediate PersistentVolumeClaims" in message, cond
        assert len(warnings(kube, ns, "dry-db", "VolumeUnbound")) == 1

        claim = get_json(kube, "pvc", "data-dry-db-0", "-n", ns)
        apply(kube, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{klass}-pv"},
                     "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                              "storageClassName": klass, "persistentVolumeReclaimPolicy": "Delete",
                              "hostPath": {"path": f"/tmp/{klass}"},
                              "claimRef": {"namespace": ns, "name": "data-dry-db-0",
                                           "uid": claim["metadata"]["uid"]}}})  # fmt: skip
        wait_ready(kube, ns, "dry-db", 1, timeout=120)
        assert condition(cluster_obj(kube, ns, "dry-db"), "Degraded").get("status") == "False"
    finally:
        kube.kubectl("delete", "storageclass", klass, "--wait=false")
