"""Nodes' readiness as the operator reads it (orchestration/nodes.py's NodeView), and the Node informer's
wake-ups for node loss — a node that goes NotReady, Unknown or away wakes the clusters with an instance
on it, and nothing else; heartbeats that change no readiness wake nobody; without the permission to read
Nodes none is watched (controller/nodes.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.cache import NODES, Cache, watched_kinds
from pg_operator.controller.loop import ReconcileLoop, Result
from pg_operator.controller.wakeups import Wakeups, feeds
from pg_operator.orchestration.nodes import Readiness, node_view
from pg_operator.specs import MANAGED_KINDS

KEY = ("shop", "db")


class Idle:
    async def reconcile(self, key: tuple[str, str]) -> Result:
        return Result()


def node(name: str, ready: str | None, rv: str = "1", at: str = "2026-01-02T11:50:00Z") -> dict[str, Any]:
    conditions = [] if ready is None else [{"type": "Ready", "status": ready, "lastTransitionTime": at}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv},
            "status": {"conditions": conditions}}  # fmt: skip


def health(body: dict[str, Any]) -> Any:
    return node_view(body).health


def test_readiness_comes_from_the_ready_condition() -> None:
    assert health(node("n1", "True")).readiness is Readiness.READY
    assert health(node("n1", "False")).readiness is Readiness.NOT_READY
    lost = health(node("n1", "Unknown"))
    assert lost.readiness is Readiness.UNKNOWN and lost.lost
    assert lost.since == datetime(2026, 1, 2, 11, 50, tzinfo=UTC)
    assert health(node("n1", None)).readiness is Readiness.UNKNOWN  # never reported


def instance(name: str, node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {CLUSTER_LABEL: "db"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                              "uid": "sts", "controller": True}]},
            "spec": {"nodeName": node_name}, "status": {}}  # fmt: skip


def woken(loop: ReconcileLoop[tuple[str, str]]) -> bool:
    """The cluster is queued for a pass now (not after a delay)."""
    return sum(loop.queue.waiting().values()) == 1


def setup() -> tuple[Wakeups, ReconcileLoop[tuple[str, str]], Cache]:
    loop: ReconcileLoop[tuple[str, str]] = ReconcileLoop(Idle(), status_delay=1.0)
    cache = Cache(watched_kinds(MANAGED_KINDS))
    w = Wakeups(loop, cache)
    w.on_cluster({"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
                  "metadata": {"name": "db", "namespace": "shop", "uid": "c", "resourceVersion": "1"}},
                 "ADDED")  # fmt: skip
    w.on_child(instance("db-0", "n1"), "ADDED")
    loop.queue = type(loop.queue)()
    return w, loop, cache


async def test_a_lost_node_wakes_the_clusters_with_an_instance_on_it() -> None:
    w, loop, cache = setup()
    node_feed = next(f for f in feeds(w, watched_kinds(MANAGED_KINDS)) if f.kind == NODES)
    node_feed.deliver(node("n1", "True"), None)  # first seen Ready: nothing on it to wake
    node_feed.deliver(node("n2", "True"), None)
    assert len(loop.queue) == 0
    node_feed.deliver(node("n1", "True", rv="2"), "MODIFIED")  # a heartbeat
    node_feed.deliver(node("n2", "Unknown", rv="2"), "MODIFIED")  # no instance of db on n2
    assert len(loop.queue) == 0
    node_feed.deliver(node("n1", "Unknown", rv="3", at="2026-01-02T11:51:00Z"), "MODIFIED")
    assert woken(loop)
    loop.queue = type(loop.queue)()
    node_feed.deliver(node("n1", "Unknown", rv="4"), "DELETED")
    assert woken(loop) and cache.node("n1") is None


async def test_a_node_gone_while_the_watch_was_down_wakes_its_clusters() -> None:
    w, loop, cache = setup()
    node_feed = next(f for f in feeds(w, watched_kinds(MANAGED_KINDS)) if f.kind == NODES)
    node_feed.deliver(node("n1", "True"), None)
    loop.queue = type(loop.queue)()
    w.listed(node_feed, None, set(), False)
    assert woken(loop) and cache.node("n1") is None


def test_without_permission_no_node_is_watched() -> None:
    loop: ReconcileLoop[tuple[str, str]] = ReconcileLoop(Idle(), status_delay=1.0)
    w = Wakeups(loop, Cache(watched_kinds(MANAGED_KINDS)))
    assert any(f.kind == NODES for f in feeds(w, watched_kinds(MANAGED_KINDS)))
    assert all(f.kind != NODES for f in feeds(w, watched_kinds(MANAGED_KINDS), nodes=False))
