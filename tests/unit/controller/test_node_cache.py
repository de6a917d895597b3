"""Nodes in the watch cache: kept as NodeViews, a heartbeat changes nothing and wakes nobody, a cordon
wakes the clusters with a pod on that node, a relisting drops vanished nodes, and a snapshot knows the
nodes only once synced and only where the operator may read them."""

from __future__ import annotations

from typing import Any

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.cache import NODES, Cache, watched_kinds
from pg_operator.controller.cache_sync import SyncGate
from pg_operator.controller.informer import Feed
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.wakeups import Wakeups
from pg_operator.specs import MANAGED_KINDS

STATEFULSET_REF = {
    "apiVersion": "apps/v1",
    "kind": "StatefulSet",
    "name": "db",
    "uid": "s1",
    "controller": True,
}


class Woken:
    """The work loop's wake-ups, recorded."""

    def __init__(self) -> None:
        self.keys: list[ClusterKey] = []

    def wake(self, key: ClusterKey) -> None:
        self.keys.append(key)

    def wake_soon(self, key: ClusterKey) -> None:
        self.keys.append(key)


def node(name: str, *, heartbeat: str = "t0", unschedulable: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": {"kubernetes.io/hostname": name}},
        "spec": {"unschedulable": unschedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat}]},
    }


def cluster(name: str) -> dict[str, Any]:
    return {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": "shop", "uid": f"u-{name}", "resourceVersion": "1"},
            "spec": {"replicas": 1, "version": "16", "storage": "1Gi"}}  # fmt: skip


def pod(name: str, cluster: str, on: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": {CLUSTER_LABEL: cluster},
                     "ownerReferences": [{**STATEFULSET_REF, "name": cluster}]},
        "spec": {"nodeName": on, "containers": [{"name": "postgres", "image": "pg:16"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def wired(gate: SyncGate | None = None) -> tuple[Cache, Wakeups, Woken]:
    cache = Cache(watched_kinds(MANAGED_KINDS), gate)
    woken = Woken()
    return cache, Wakeups(woken, cache), woken  # type: ignore[arg-type]  # duck-typed work loop


def test_a_heartbeat_changes_nothing_and_a_cordon_wakes_the_clusters_on_that_node() -> None:
    cache, wakeups, woken = wired()
    for name, on in (("a", "n1"), ("b", "n2")):
        cache.observe(cluster(name), None)
        cache.observe(pod(f"{name}-0", name, on), None)
    wakeups.on_node(node("n1"), None)
    wakeups.on_node(node("n2"), None)
    woken.keys.clear()
    wakeups.on_node(node("n1", heartbeat="t1"), "MODIFIED")
    assert woken.keys == []
    wakeups.on_node(node("n1", heartbeat="t2", unschedulable=True), "MODIFIED")
    assert woken.keys == [("shop", "a")]
    snapshot = cache.snapshot(("shop", "a"))
    assert snapshot.nodes is not None and [n.name for n in snapshot.nodes] == ["n1", "n2"]
    n1 = snapshot.node("n1")
    assert n1 is not None and n1.draining


def test_a_relisting_drops_nodes_it_did_not_show_and_a_deleted_node_goes() -> None:
    cache, wakeups, _ = wired()
    for name in ("n1", "n2", "n3"):
        wakeups.on_node(node(name), None)
    wakeups.listed(Feed(NODES, wakeups.on_node), None, {"uid-n1", "uid-n2"}, False)
    wakeups.on_node(node("n2"), "DELETED")
    assert [n.name for n in cache.snapshot(("shop", "x")).nodes or ()] == ["n1"]


def test_nodes_are_known_only_once_synced_and_only_where_readable() -> None:
    gate = SyncGate()
    cache, wakeups, _ = wired(gate)
    gate.expect([(NODES.key, None)])
    wakeups.on_node(node("n1"), None)
    assert cache.snapshot(("shop", "x")).nodes is None  # not every node seen yet: no claim
    wakeups.listed(Feed(NODES, wakeups.on_node), None, {"uid-n1"}, True)
    assert [n.name for n in cache.snapshot(("shop", "x")).nodes or ()] == ["n1"]
    cache.nodes_readable = False
    assert cache.snapshot(("shop", "x")).nodes is None
