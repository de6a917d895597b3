"""Nodes as the operator reads them (cordon, drain taints, readiness, which nodes admit the instances) and
the switchover a drain of the primary's node calls for."""

from __future__ import annotations

from typing import Any

from harness.pods import instance_pod
from pg_operator.orchestration.drains import draining_primary_node, plan_drain
from pg_operator.orchestration.instances import Instance, instances_from_pods, parse_members
from pg_operator.orchestration.nodes import NodeView, TolerationView, matching, node_view, schedulable


def node(name: str, *, ready: str = "True", unschedulable: bool = False,
         taints: list[dict[str, str]] | None = None, **labels: str) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"kubernetes.io/hostname": name, **labels},
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
            "images": [{"names": ["something"], "sizeBytes": 1}],
        },
    }


CORDON_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def test_a_node_view_keeps_what_placement_and_drains_read_and_not_the_heartbeat() -> None:
    view = node_view(node("n1", **{"topology.kubernetes.io/zone": "zone-a"}))
    assert view.name == "n1" and view.ready is True and not view.draining
    assert view.label("topology.kubernetes.io/zone") == "zone-a"
    later = node("n1", **{"topology.kubernetes.io/zone": "zone-a"})
    later["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T00:00:10Z"
    assert node_view(later) == view  # a heartbeat changes nothing the operator reads
    assert node_view(node("n1", ready="Unknown")).ready is None
    assert node_view(node("n1", ready="False")).ready is False


def test_a_node_is_draining_when_cordoned_or_carrying_a_drain_taint() -> None:
    assert node_view(node("n1", unschedulable=True)).draining
    assert node_view(node("n1", taints=[CORDON_TAINT])).draining
    autoscaler = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}
    assert node_view(node("n1", taints=[autoscaler])).draining
    # A taint that only keeps other workloads off, or a soft one, is no drain.
    assert not node_view(
        node("n1", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
    ).draining
    soft = {"key": "node.kubernetes.io/unschedulable", "effect": "PreferNoSchedule"}
    assert not node_view(node("n1", taints=[soft])).draining


def test_nodes_admit_the_instances_by_selector_and_tolerations_and_cordoned_ones_still_count() -> None:
    dedicated = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}
    nodes = [
        node_view(node("a", disk="ssd")),
        node_view(node("b", disk="hdd")),
        node_view(node("c", disk="ssd", taints=[dedicated])),
        node_view(node("d", disk="ssd", unschedulable=True, taints=[CORDON_TAINT])),
    ]
    assert [n.name for n in matching(nodes, {"disk": "ssd"})] == ["a", "d"]
    tolerate = [TolerationView("dedicated", "Equal", "db", "NoSchedule")]
    assert [n.name for n in matching(nodes, {"disk": "ssd"}, tolerate)] == ["a", "c", "d"]
    assert [n.name for n in matching(nodes, {}, [TolerationView(None, "Exists", None, None)])] == list("abcd")
    wrong_value = [TolerationView("dedicated", "Equal", "web", "NoSchedule")]
    assert [n.name for n in matching(nodes, {"disk": "ssd"}, wrong_value)] == ["a", "d"]
    # Schedulable now: Ready and not being drained.
    assert [n.name for n in schedulable([*nodes, node_view(node("e", ready="Unknown"))])] == ["a", "b", "c"]


# --- drains ----------------------------------------------------------------------------------------


def bound(pod: dict[str, Any], where: str) -> dict[str, Any]:
    pod["spec"]["nodeName"] = where
    return pod


def cluster_on(nodes: dict[str, str], sync: str | None = None) -> tuple[list[Instance], list[dict[str, Any]]]:
    """db-0 (primary) on nodes['db-0'], db-1 and db-2 replicas; Patroni's view with `sync` as the
    synchronous standby when given."""
    pods = [
        bound(instance_pod(n, "primary" if n == "db-0" else "replica"), where) for n, where in nodes.items()
    ]
    rows = [{"name": "db-0", "role": "leader", "state": "running", "lag": 0, "timeline": 1}]
    rows += [
        {"name": n, "role": "sync_standby" if n == sync else "replica", "state": "streaming", "lag": 0,
         "timeline": 1}
        for n in nodes if n != "db-0"
    ]  # fmt: skip
    return instances_from_pods(pods, parse_members({"members": rows})), pods


def views(*cordoned: str, not_ready: tuple[str, ...] = ()) -> list[NodeView]:
    return [
        node_view(node(n, unschedulable=n in cordoned, ready="Unknown" if n in not_ready else "True"))
        for n in ("n1", "n2", "n3")
    ]


def test_no_drain_step_while_the_primarys_node_is_not_being_drained() -> None:
    instances, pods = cluster_on({"db-0": "n1", "db-1": "n2", "db-2": "n3"})
    assert plan_drain(instances, pods, views()) is None
    assert plan_drain(instances, pods, views("n2")) is None  # a replica's node: the replicas' budget
    assert plan_drain(instances, pods, None) is None  # Nodes not readable: no drain handling


def test_a_drain_of_the_primarys_node_switches_over_to_a_replica_on_a_node_that_stays() -> None:
    instances, pods = cluster_on({"db-0": "n1", "db-1": "n2", "db-2": "n3"})
    assert draining_primary_node(instances, pods, views("n1")) == views("n1")[0]
    action = plan_drain(instances, pods, views("n1"))
    assert action is not None and (action.kind, action.target) == ("switchover", "db-1")
    assert "node n1 of primary db-0 is being drained" in action.reason and "db-1 on node n2" in action.reason
    # db-1's node is being drained too, or is not Ready: db-2.
    for nodes in (views("n1", "n2"), views("n1", not_ready=("n2",))):
        action = plan_drain(instances, pods, nodes)
        assert action is not None and (action.kind, action.target) == ("switchover", "db-2")


def test_a_replica_sharing_the_primarys_node_is_no_candidate() -> None:
    instances, pods = cluster_on({"db-0": "n1", "db-1": "n1", "db-2": "n2"})
    action = plan_drain(instances, pods, views("n1"))
    assert action is not None and (action.kind, action.target) == ("switchover", "db-2")


def test_with_synchronous_standbys_only_one_on_a_node_that_stays_qualifies() -> None:
    instances, pods = cluster_on({"db-0": "n1", "db-1": "n2", "db-2": "n3"}, sync="db-2")
    action = plan_drain(instances, pods, views("n1"))
    assert action is not None and (action.kind, action.target) == ("switchover", "db-2")
    # The synchronous standby's node is being drained as well: Patroni would refuse db-1, so wait.
    action = plan_drain(instances, pods, views("n1", "n3"))
    assert action is not None and action.kind == "wait"


def test_without_a_candidate_the_drain_waits_and_says_why() -> None:
    instances, pods = cluster_on({"db-0": "n1", "db-1": "n2", "db-2": "n3"})
    action = plan_drain(instances, pods, views("n1", "n2", "n3"))
    assert action is not None and action.kind == "wait"
    assert "node n1 of primary db-0 is being drained" in action.reason
    alone = [bound(instance_pod("db-0", "primary"), "n1")]
    action = plan_drain(instances_from_pods(alone), alone, views("n1"))
    assert action is not None and action.kind == "wait" and "only instance" in action.reason


def test_patronis_leader_is_the_primary_while_the_pod_labels_trail_a_switchover() -> None:
    """Right after the switchover the cache may still show db-0 labelled primary: Patroni's view says
    db-1 leads, on a node that stays, so no second switchover follows."""
    pods = [bound(instance_pod("db-0", "primary"), "n1"), bound(instance_pod("db-1"), "n2"),
            bound(instance_pod("db-2"), "n3")]  # fmt: skip
    rows = [
        {"name": "db-0", "role": "replica", "state": "streaming", "lag": 0, "timeline": 2},
        {"name": "db-1", "role": "leader", "state": "running", "lag": 0, "timeline": 2},
        {"name": "db-2", "role": "replica", "state": "streaming", "lag": 0, "timeline": 2},
    ]
    instances = instances_from_pods(pods, parse_members({"members": rows}))
    assert draining_primary_node(instances, pods, views("n1")) is None
    assert plan_drain(instances, pods, views("n1")) is None
