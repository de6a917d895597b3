"""Drains and spread on three real nodes (docs/high-availability.md#drains), on the sub-tier's shared
cluster (three instances, synchronous, a pooler, zone spread required): one instance per node and zone
with the `auto` anti-affinity made required; `kubectl drain` of the primary's node under a writer through
the pooler switches over first (no transaction fails), finishes, and after `kubectl uncordon` the cluster
is 3/3 Ready again.

The writer runs in a pod on a node that is not drained (harness/pod_writer.py): the host reaches no
Service address on a multi-node profile."""

from __future__ import annotations

from harness.kube import get_json
from harness.nodes_cluster import NodesCluster
from harness.pod_writer import PodWriter, writer_pod
from harness.waiting import wait_until

ZONE = "topology.kubernetes.io/zone"


def test_instances_spread_one_per_node_and_zone_with_the_budgets_drains_go_through(
    nodes_cluster: NodesCluster,
) -> None:
    kube, ns, name = nodes_cluster.kube, nodes_cluster.namespace, nodes_cluster.name
    where = {pod: p["spec"]["nodeName"] for pod, p in nodes_cluster.pods().items()}
    assert len(where) == 3 and len(set(where.values())) == 3, where
    zones = {pod: get_json(kube, "node", node)["metadata"]["labels"][ZONE] for pod, node in where.items()}
    assert len(set(zones.values())) == 3, zones
    template = get_json(kube, "statefulset", name, "-n", ns)["spec"]["template"]["spec"]
    # `auto` on three schedulable nodes for three instances: required, kept from now on.
    assert template["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (spread,) = template["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"], spread["maxSkew"]) == (
        ZONE,
        "DoNotSchedule",
        1,
    )
    budgets = {b["metadata"]["name"]: b for b in get_json(kube, "pdb", "-n", ns)["items"]}
    primary_budget, replicas_budget = budgets[f"{name}-primary"], budgets[name]
    assert primary_budget["spec"]["minAvailable"] == 1
    assert primary_budget["spec"]["selector"]["matchLabels"]["role"] == "primary"
    assert (primary_budget["status"]["expectedPods"], primary_budget["status"]["disruptionsAllowed"]) == (
        1,
        0,
    )
    assert replicas_budget["spec"]["minAvailable"] == 1
    assert (replicas_budget["status"]["expectedPods"], replicas_budget["status"]["disruptionsAllowed"]) == (
        2,
        1,
    )
    pooler_budget = budgets[f"{name}-pooler-rw"]
    assert pooler_budget["spec"]["maxUnavailable"] == 1 and pooler_budget["status"]["expectedPods"] == 2


def test_a_drain_of_the_primarys_node_switches_over_first_and_fails_no_pooled_transaction(
    nodes_cluster: NodesCluster,
) -> None:
    kube, ns, name = nodes_cluster.kube, nodes_cluster.namespace, nodes_cluster.name
    old_primary = nodes_cluster.serving()
    drained = nodes_cluster.node_of(old_primary)
    nodes = sorted(n["metadata"]["name"] for n in get_json(kube, "nodes")["items"])
    writer_node = next(n for n in nodes if n != drained)
    writer = PodWriter(kube, writer_pod("tx-writer", ns, name, f"{name}-pooler-rw", writer_node, "drain_tx"))
    writer.start()
    try:
        writer.wait_for(50, 120)
        res = kube.kubectl("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                           "--timeout=300s", check=False, timeout=330)  # fmt: skip
        assert res.returncode == 0, (
            f"the drain of {drained} did not finish:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        )
        new_primary = str(wait_until("a new primary", lambda: _moved(nodes_cluster, old_primary), 120, 1))
        assert nodes_cluster.node_of(new_primary) != drained
        # The operator switched over because of the drain, before the eviction could take the primary.
        events = get_json(kube, "events", "-n", ns, "--field-selector", "reason=Switchover")["items"]
        assert any(
            f"node {drained} of primary {old_primary} is being drained" in e["message"] for e in events
        ), [e["message"] for e in events]
        wait_until(
            "the pooler on the new primary", lambda: nodes_cluster.pooler_pointing_at(new_primary), 120, 1
        )
        writer.wait_for(50, 120)
    finally:
        summary = writer.stop()
        kube.kubectl("uncordon", drained, check=False)
    assert summary.failed == 0, summary.errors
    assert summary.acked >= 100
    # Uncordoned, the evicted instance's pod is scheduled again on its node (its volume is there).
    nodes_cluster.serving()
    assert len({nodes_cluster.node_of(p) for p in nodes_cluster.pods()}) == 3


def _moved(shared: NodesCluster, old_primary: str) -> str | None:
    primary = shared.primary()
    return primary if primary != old_primary else None
