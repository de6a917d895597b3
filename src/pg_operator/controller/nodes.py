"""What the operator knows of the cluster's Nodes: the one place Nodes are read (listed and watched,
cluster-scoped), kept as a small typed directory of each node's readiness, not as whole objects.

A node that stops sending heartbeats is marked `Ready=Unknown` by the node lifecycle controller after its
node-monitor grace period (kube-controller-manager `--node-monitor-grace-period`, 50 s by default); its
pods stay bound to it, `Running` or `Terminating`, and the kubelet that would confirm their end is
silent. Only the Node says so: the instances sub-reconcilers read this directory to report such an
instance and, when allowed, to replace it (reconcilers/node_loss.py).

Nodes are cluster-scoped: a namespaced install may hold no permission to read them. The operator asks
the API server once, at start (`nodes_readable`); without the permission it does not watch them and
nothing is reported as lost (`NodeDirectory.readable` False).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pg_operator import objects
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.cache_sync import ListedKind
from pg_operator.controller.kube_api import Api, allowed
from pg_operator.orchestration.node_loss import NodeHealth, Readiness

log = logging.getLogger(__name__)

NODE_KIND = ("v1", "Node")
NODES = ListedKind("v1", "Node", "nodes", namespaced=False)
# What the operator does with Nodes (deploy/operator/rbac.yaml, the chart's ClusterRole): list and watch
# them; get is granted with them for kubectl-style reads of one node.
NODE_VERBS = ("list", "watch")
NODES_UNREADABLE = (
    "this operator may not list and watch Nodes (a namespaced install): an instance on a lost node is "
    "neither reported nor replaced (docs/high-availability.md)"
)
# The taint the node lifecycle controller puts on a node whose Ready is Unknown (it stopped reporting).
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def node_health(node: Mapping[str, Any]) -> NodeHealth:
    """A Node's readiness from its Ready condition (absent: not ready yet, as a node that never reported)."""
    ready = objects.condition(objects.status(node), "Ready") or {}
    value = str(ready.get("status") or "")
    readiness = {"True": Readiness.READY, "False": Readiness.NOT_READY}.get(value, Readiness.UNKNOWN)
    return NodeHealth(objects.name(node), readiness, parse_time(str(ready.get("lastTransitionTime") or "")))


class NodeDirectory:
    """Every node's readiness, fed by the Node informer (`observe`, `listed`). `health(name)` is None for a
    node that is not (or no longer) there once a listing is in."""

    def __init__(self, readable: bool = True) -> None:
        self.readable = readable
        self.listed = False  # a first complete listing is in: a node absent from it is gone
        self._nodes: dict[str, NodeHealth] = {}
        self._uids: dict[str, str] = {}  # uid -> name, for a listing's pruning

    def observe(self, body: Mapping[str, Any], event_type: str | None) -> NodeHealth | None:
        """One watch event or listed object: the node if what the clusters on it see changed — it went,
        its readiness changed, or it appeared lost — else None (a heartbeat; a new node that is Ready, as
        every node of a first listing is: waking every cluster for those would cost a scan per node)."""
        name = objects.name(body)
        before = self._nodes.get(name)
        if event_type == "DELETED":
            self._nodes.pop(name, None)
            self._uids.pop(objects.uid(body), None)
            return before
        health = node_health(body)
        self._nodes[name] = health
        self._uids[objects.uid(body)] = name
        if before is None:
            return health if health.lost else None
        return health if before.readiness is not health.readiness else None

    def prune(self, uids: set[str]) -> list[str]:
        """A complete listing held these uids: the nodes gone meanwhile."""
        gone = [name for uid, name in self._uids.items() if uid not in uids]
        for name in gone:
            self._nodes.pop(name, None)
        self._uids = {uid: name for uid, name in self._uids.items() if uid in uids}
        self.listed = True
        return gone

    def health(self, name: str) -> NodeHealth | None:
        return self._nodes.get(name)

    def known(self) -> bool:
        """Whether absence means gone: readable and listed at least once."""
        return self.readable and self.listed

    def fill(self, nodes: list[Mapping[str, Any]]) -> None:
        """The directory from a whole listing at once (tests, and a caller without informers)."""
        for node in nodes:
            self.observe(node, None)
        self.prune({objects.uid(n) for n in nodes})


async def nodes_readable(api: Api) -> bool:
    """Whether the API server's authorizer lets this operator list and watch Nodes."""
    return await allowed(api, "", "nodes", NODE_VERBS)


async def may_read_nodes(api: Api) -> bool:
    """nodes_readable, asked until the API server answers (every install asks: one whose RBAC predates
    Node reads must not wait forever on a listing it is refused)."""
    backoff, failures = Backoff(), 0
    while True:
        try:
            readable = await nodes_readable(api)
            break
        except Exception as exc:
            failures += 1
            delay = backoff.delay(failures)
            log.warning("asking whether Nodes are readable failed, retrying in %.1fs: %s", delay, exc)
            await asyncio.sleep(delay)
    if not readable:
        log.warning("%s", NODES_UNREADABLE)
    return readable


def pods_on(pods: list[dict[str, Any]], node: str) -> bool:
    return any(objects.spec(p).get("nodeName") == node for p in pods)


class NodeFeed:
    """The Node informer's receiver: keeps the directory and wakes, through `wake(node)`, the clusters with
    an instance on a node whose readiness changed or that went."""

    def __init__(self, directory: NodeDirectory, wake: Callable[[str], None]) -> None:
        self.directory = directory
        self.wake = wake

    def deliver(self, body: dict[str, Any], event_type: str | None) -> None:
        changed = self.directory.observe(body, event_type)
        if changed is not None:
            if changed.lost or event_type == "DELETED":
                log.info("node %s: %s", changed.name, "gone" if event_type == "DELETED" else
                         changed.readiness.value)  # fmt: skip
            self.wake(changed.name)

    def listed(self, uids: set[str]) -> None:
        for name in self.directory.prune(uids):
            log.info("node %s: gone while the watch was down", name)
            self.wake(name)
