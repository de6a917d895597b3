"""Where instances and pooler pods may run (anti-affinity, the `auto` choice kept once made, zone spread),
the too-few-nodes report, and the disruption budgets drains go through."""

from __future__ import annotations

from typing import Any

import pytest

from harness.objects import cluster_model as cluster
from pg_operator.orchestration.nodes import NodeView, Readiness, Taint
from pg_operator.specs import desired_children
from pg_operator.specs.pdb import pdbs
from pg_operator.specs.placement import live_anti_affinity, too_few_nodes
from pg_operator.specs.pooler import children as pooler_children
from pg_operator.specs.statefulset import statefulset

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"
READY = Readiness.READY


def nodes(count: int, *, cordoned: int = 0, labels: dict[str, str] | None = None) -> list[NodeView]:
    out = []
    for i in range(count):
        own = {HOST: f"n{i}", ZONE: f"zone-{i}", **(labels or {})}
        out.append(NodeView(f"n{i}", tuple(sorted(own.items())), unschedulable=i < cordoned, readiness=READY))
    return out


def pod_spec(sts: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = sts["spec"]["template"]["spec"]
    return spec


def test_auto_is_required_when_created_on_enough_schedulable_nodes() -> None:
    sts = statefulset(cluster(replicas=3), None, nodes(3))
    term = pod_spec(sts)["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == [
        {"labelSelector": {"matchLabels": sts["spec"]["selector"]["matchLabels"]}, "topologyKey": HOST}
    ]
    assert live_anti_affinity(sts) == "required"


def test_auto_is_preferred_on_fewer_nodes_and_without_node_reads() -> None:
    for seen in (nodes(1), nodes(3, cordoned=1), nodes(2), None):
        sts = statefulset(cluster(replicas=3), None, seen)
        assert live_anti_affinity(sts) == "preferred", seen
    # Nodes the instances' nodeSelector leaves out do not count.
    sts = statefulset(cluster(replicas=3, nodeSelector={"disk": "ssd"}), None, nodes(5))
    assert live_anti_affinity(sts) == "preferred"
    sts = statefulset(
        cluster(replicas=3, nodeSelector={"disk": "ssd"}), None, nodes(3, labels={"disk": "ssd"})
    )
    assert live_anti_affinity(sts) == "required"


def test_auto_keeps_what_the_live_statefulset_has_whatever_the_nodes_do_later() -> None:
    c = cluster(replicas=3)
    required = statefulset(c, None, nodes(3))
    # A node lost or drained later: still required (a change would restart every instance).
    assert live_anti_affinity(statefulset(c, required, nodes(2))) == "required"
    assert live_anti_affinity(statefulset(c, required, None)) == "required"
    preferred = statefulset(c, None, nodes(1))
    assert live_anti_affinity(statefulset(c, preferred, nodes(5))) == "preferred"
    # An explicit choice wins over the live one.
    explicit = cluster(replicas=3, affinity={"podAntiAffinity": "preferred"})
    assert live_anti_affinity(statefulset(explicit, required, nodes(3))) == "preferred"
    none = cluster(replicas=3, affinity={"podAntiAffinity": "none"})
    assert "affinity" not in pod_spec(statefulset(none, None, nodes(3)))


def test_zone_spread_is_a_soft_topology_spread_constraint_by_default_and_hard_on_request() -> None:
    (soft,) = pod_spec(statefulset(cluster(), None, nodes(3)))["topologySpreadConstraints"]
    assert (soft["maxSkew"], soft["topologyKey"], soft["whenUnsatisfiable"]) == (1, ZONE, "ScheduleAnyway")
    assert soft["nodeTaintsPolicy"] == "Honor"
    hard_cluster = cluster(affinity={"zoneSpread": "required", "zoneTopologyKey": "example.com/rack"})
    (hard,) = pod_spec(statefulset(hard_cluster))["topologySpreadConstraints"]
    assert (hard["topologyKey"], hard["whenUnsatisfiable"]) == ("example.com/rack", "DoNotSchedule")
    assert "topologySpreadConstraints" not in pod_spec(statefulset(cluster(affinity={"zoneSpread": "none"})))


def test_too_few_nodes_for_a_required_anti_affinity_is_reported_with_the_count() -> None:
    c = cluster(replicas=4)
    sts = statefulset(cluster(replicas=3), None, nodes(3))  # required, made for three
    message = too_few_nodes(c, sts, nodes(3))
    assert message is not None
    assert "spec.replicas is 4 but only 3 node(s) admit the instances" in message
    assert "podAntiAffinity: preferred" in message
    assert too_few_nodes(cluster(replicas=3), sts, nodes(3)) is None
    # A cordoned node still counts (it comes back on uncordon): no report during a drain.
    assert too_few_nodes(cluster(replicas=3), sts, nodes(3, cordoned=1)) is None
    # Preferred lets instances share: nothing stays Pending for want of nodes. Unknown nodes: no claim.
    assert too_few_nodes(c, statefulset(c, None, nodes(1)), nodes(1)) is None
    assert too_few_nodes(c, sts, None) is None
    tainted = [
        NodeView("n0", ((HOST, "n0"),), taints=(Taint("dedicated", "db", "NoSchedule"),), readiness=READY)
    ]
    message = too_few_nodes(cluster(replicas=3), sts, [*nodes(2), *tainted])
    assert message is not None and "only 2 node(s) admit the instances (of 3 node(s)" in message


def selectors(budgets: list[dict[str, Any]]) -> dict[str, tuple[dict[str, str], dict[str, int]]]:
    out = {}
    for b in budgets:
        limit = {k: v for k, v in b["spec"].items() if k in ("minAvailable", "maxUnavailable")}
        out[b["metadata"]["name"]] = (b["spec"]["selector"]["matchLabels"], limit)
        assert b["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    return out


def test_with_drains_handled_the_primary_budget_refuses_and_the_replicas_budget_allows_one() -> None:
    got = selectors(pdbs(cluster(replicas=3)))
    primary_labels, primary_limit = got["orders-db-primary"]
    replica_labels, replica_limit = got["orders-db"]
    # Counted in pods: the primary's one pod kept, the replicas less one kept.
    assert primary_limit == {"minAvailable": 1} and replica_limit == {"minAvailable": 1}
    assert selectors(pdbs(cluster(replicas=5)))["orders-db"][1] == {"minAvailable": 3}
    assert selectors(pdbs(cluster(replicas=2)))["orders-db"][1] == {"minAvailable": 0}
    # Disjoint: a pod under two budgets cannot be evicted at all.
    assert (primary_labels["role"], replica_labels["role"]) == ("primary", "replica")
    assert {k: v for k, v in primary_labels.items() if k != "role"} == {
        k: v for k, v in replica_labels.items() if k != "role"
    }


def test_without_node_reads_one_budget_keeps_one_instance_of_any_role() -> None:
    got = selectors(pdbs(cluster(replicas=3), drains_handled=False))
    assert list(got) == ["orders-db"]
    labels, limit = got["orders-db"]
    assert "role" not in labels and limit == {"minAvailable": 1}


def test_one_instance_has_no_budget_unless_the_user_blocks_drains() -> None:
    assert pdbs(cluster(replicas=1)) == []
    assert pdbs(cluster(replicas=1), drains_handled=False) == []
    got = selectors(pdbs(cluster(replicas=1, disruption={"singleInstance": "Block"})))
    assert list(got) == ["orders-db-primary"] and got["orders-db-primary"][1] == {"minAvailable": 1}


def test_desired_children_carry_both_budgets_when_nodes_are_read() -> None:
    names = [c["metadata"]["name"] for c in desired_children(cluster(), nodes=nodes(3))
             if c["kind"] == "PodDisruptionBudget"]  # fmt: skip
    assert names == ["orders-db-primary", "orders-db"]


def test_the_pooler_spreads_over_nodes_and_zones_and_its_budget_takes_one_pod_at_a_time() -> None:
    c = cluster(pooler={"instances": 3})
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in pooler_children(c)}
    deployment = by_kind[("Deployment", "orders-db-pooler-rw")]
    spec = deployment["spec"]["template"]["spec"]
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == HOST
    (spread,) = spec["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == (ZONE, "ScheduleAnyway")
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    budget = by_kind[("PodDisruptionBudget", "orders-db-pooler-rw")]
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]


def test_pooler_pods_leave_a_lost_node_after_30_s_unless_the_user_says_otherwise() -> None:
    def tolerations(c: Any) -> dict[str, Any]:
        deployment = next(o for o in pooler_children(c) if o["kind"] == "Deployment")
        return {t["key"]: t for t in deployment["spec"]["template"]["spec"]["tolerations"]}

    unreachable, not_ready = "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"
    mine = tolerations(cluster(pooler={}))
    assert {k: (t["effect"], t["tolerationSeconds"]) for k, t in mine.items()} == {
        unreachable: ("NoExecute", 30),
        not_ready: ("NoExecute", 30),
    }
    users = {"key": unreachable, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600}
    theirs = tolerations(cluster(pooler={}, tolerations=[users]))
    assert theirs[unreachable]["tolerationSeconds"] == 600 and theirs[not_ready]["tolerationSeconds"] == 30
    # The instances keep the API server's defaults: a StatefulSet does not replace an evicted pod anyway.
    pod = statefulset(cluster())["spec"]["template"]["spec"]
    assert not any(t.get("key") == unreachable for t in pod.get("tolerations") or [])


def test_node_affinity_expressions_reach_the_pods_and_decide_which_nodes_count() -> None:
    expressions = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["db.large", "db.xlarge"]},
        {"key": "example.com/spot", "operator": "DoesNotExist"},
    ]
    c = cluster(replicas=3, affinity={"nodeAffinity": expressions})
    spec = pod_spec(statefulset(c, None, None))
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
    assert "podAntiAffinity" in spec["affinity"]  # beside the anti-affinity, not instead of it
    pooler_spec = pooler_children(cluster(pooler={}, affinity={"nodeAffinity": expressions}))[0]
    assert (
        pooler_spec["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        == spec["affinity"]["nodeAffinity"]
    )
    # Only nodes the expressions admit count for `auto` and for the too-few-nodes report.
    large = nodes(3, labels={"node.kubernetes.io/instance-type": "db.large"})
    assert live_anti_affinity(statefulset(c, None, large)) == "required"
    spot = nodes(3, labels={"node.kubernetes.io/instance-type": "db.large", "example.com/spot": "true"})
    assert live_anti_affinity(statefulset(c, None, spot)) == "preferred"
    assert live_anti_affinity(statefulset(c, None, nodes(3))) == "preferred"


def test_node_affinity_expressions_are_checked_naming_the_field() -> None:
    for bad, needle in (
        ({"key": "zone", "operator": "In"}, "In and NotIn take values"),
        ({"key": "zone", "operator": "Exists", "values": ["a"]}, "Exists and DoesNotExist none"),
        ({"key": "-bad", "operator": "Exists"}, "nodeAffinity: key must be a label key"),
        (
            {"key": "zone", "operator": "In", "values": ["not a value"]},
            "nodeAffinity: a value must be a label value",
        ),
    ):
        with pytest.raises(ValueError, match=needle):
            cluster(affinity={"nodeAffinity": [bad]})
