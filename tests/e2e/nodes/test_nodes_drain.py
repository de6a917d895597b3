"""Drains and spread on three real nodes (docs/high-availability.md#drains): a three-instance cluster with
a pooler, zone spread required, lands one instance per node and zone with the `auto` anti-affinity made
required; `kubectl drain` of the primary's node under a writer through the pooler switches over first (no
transaction fails), finishes, and after `kubectl uncordon` the cluster is 3/3 Ready again.

The writer runs in a pod on a node that is not drained (harness/pod_writer.py): the host reaches no
Service address on a multi-node profile."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.objects import cluster
from harness.pgcluster import SMALL, healthy, status
from harness.pod_writer import PodWriter, writer_pod
from harness.waiting import wait_until

NAME = "drained"
POOLER = {"instances": 2, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}}
SPEC: dict[str, Any] = {
    "replicas": 3,
    "resources": SMALL,
    "pooler": POOLER,
    "affinity": {"zoneSpread": "required"},
}
ZONE = "topology.kubernetes.io/zone"


def pods_of(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    items = get_json(kube, "pods", "-n", ns, "-l", f"db.example.com/cluster={NAME}")["items"]
    return {p["metadata"]["name"]: p for p in items}


def node_of(kube: Kube, ns: str, pod: str) -> str:
    return str(pods_of(kube, ns)[pod]["spec"].get("nodeName") or "")


def pooler_pointing_at(kube: Kube, ns: str, primary: str) -> bool:
    cond = next((c for c in status(kube, ns, NAME).get("conditions") or () if c["type"] == "Pooler"), {})
    return cond.get("status") == "True" and f"{primary}.{NAME}.{ns}.svc" in cond.get("message", "")


def serving(kube: Kube, ns: str) -> dict[str, Any]:
    st: dict[str, Any] = wait_until(f"{NAME} healthy", lambda: healthy(kube, ns, NAME, 3), 900, 2)
    wait_until(f"{NAME} Ready", lambda: _condition(kube, ns, "Ready") == "True", 300, 2)
    primary = str(st["currentPrimary"])
    wait_until("the pooler pointed at the primary", lambda: pooler_pointing_at(kube, ns, primary), 300, 2)
    return st


def _condition(kube: Kube, ns: str, kind: str) -> str | None:
    conds = status(kube, ns, NAME).get("conditions") or ()
    return next((str(c["status"]) for c in conds if c["type"] == kind), None)


@pytest.fixture(scope="module")
def ns(nodes_operator: Kube) -> Iterator[str]:
    name = f"drain-{uuid.uuid4().hex[:6]}"
    nodes_operator.kubectl("create", "namespace", name)
    nodes_operator.kubectl("apply", "-f", "-", input=json.dumps(cluster(NAME, name, **SPEC)))
    serving(nodes_operator, name)
    yield name
    nodes_operator.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def test_instances_spread_one_per_node_and_zone_with_the_budgets_drains_go_through(
    nodes_operator: Kube, ns: str
) -> None:
    kube = nodes_operator
    pods = pods_of(kube, ns)
    where = {name: p["spec"]["nodeName"] for name, p in pods.items()}
    assert len(pods) == 3 and len(set(where.values())) == 3, where
    zones = {name: get_json(kube, "node", node)["metadata"]["labels"][ZONE] for name, node in where.items()}
    assert len(set(zones.values())) == 3, zones
    sts = get_json(kube, "statefulset", NAME, "-n", ns)["spec"]["template"]["spec"]
    # `auto` on three schedulable nodes for three instances: required, kept from now on.
    assert sts["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (spread,) = sts["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"], spread["maxSkew"]) == (
        ZONE,
        "DoNotSchedule",
        1,
    )
    budgets = {b["metadata"]["name"]: b for b in get_json(kube, "pdb", "-n", ns)["items"]}
    primary_budget, replicas_budget = budgets[f"{NAME}-primary"], budgets[NAME]
    assert primary_budget["spec"]["maxUnavailable"] == 0
    assert primary_budget["spec"]["selector"]["matchLabels"]["role"] == "primary"
    assert (
        primary_budget["status"]["expectedPods"] == 1 and primary_budget["status"]["disruptionsAllowed"] == 0
    )
    assert replicas_budget["spec"]["maxUnavailable"] == 1
    assert (
        replicas_budget["status"]["expectedPods"] == 2
        and replicas_budget["status"]["disruptionsAllowed"] == 1
    )
    pooler_budget = budgets[f"{NAME}-pooler-rw"]
    assert pooler_budget["spec"]["maxUnavailable"] == 1 and pooler_budget["status"]["expectedPods"] == 2


def test_a_drain_of_the_primarys_node_switches_over_first_and_fails_no_pooled_transaction(
    nodes_operator: Kube, ns: str
) -> None:
    kube = nodes_operator
    old_primary = str(status(kube, ns, NAME)["currentPrimary"])
    drained = node_of(kube, ns, old_primary)
    nodes = [n["metadata"]["name"] for n in get_json(kube, "nodes")["items"]]
    writer_node = next(n for n in sorted(nodes) if n != drained)
    writer = PodWriter(kube, writer_pod("tx-writer", ns, NAME, f"{NAME}-pooler-rw", writer_node, "drain_tx"))
    writer.start()
    try:
        writer.wait_for(50, 120)
        res = kube.kubectl("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                           "--timeout=300s", check=False, timeout=330)  # fmt: skip
        assert res.returncode == 0, (
            f"the drain of {drained} did not finish:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        )

        def moved() -> str | None:
            primary = status(kube, ns, NAME).get("currentPrimary")
            return str(primary) if primary and primary != old_primary else None

        new_primary = str(wait_until("a new primary", moved, 120, 1))
        assert node_of(kube, ns, new_primary) != drained
        # The drain evicted the old primary only after the switchover: the operator said why it switched.
        events = get_json(kube, "events", "-n", ns, "--field-selector", "reason=Switchover")["items"]
        assert any(
            f"node {drained} of primary {old_primary} is being drained" in e["message"] for e in events
        ), [e["message"] for e in events]
        wait_until(
            "the pooler pointed at the new primary", lambda: pooler_pointing_at(kube, ns, new_primary), 120, 1
        )
        writer.wait_for(50, 120)
    finally:
        summary = writer.stop()
        kube.kubectl("uncordon", drained, check=False)
    assert summary.failed == 0, summary.errors
    assert summary.acked >= 100
    # Uncordoned, the evicted instance's pod is scheduled again on its node (its volume is there).
    serving(kube, ns)
    assert len({node_of(kube, ns, p) for p in pods_of(kube, ns)}) == 3
