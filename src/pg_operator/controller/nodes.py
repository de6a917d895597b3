"""Whether the operator may read Nodes, and what it does without them.

Nodes are read by one informer (controller/wakeups.py feeds them to the cache, controller/cache.py keeps
each as an orchestration.nodes.NodeView: labels, taints, cordon, readiness and since when; a heartbeat
changes none of it) and reach every sub-reconciler through the snapshot (`Snapshot.nodes`):

- node loss (reconcilers/node_loss.py): a node whose Ready went `Unknown` or `False`, or that is gone,
  leaves its pods bound to it; the instance is reported and, when allowed, replaced elsewhere;
- drains and placement (reconcilers/drains.py, high_availability.py): a cordoned or drain-tainted node
  holding the primary is met with a switchover; `auto` anti-affinity and `TooFewNodes` count the nodes.

Nodes are cluster-scoped: a namespaced install may hold no permission to read them. The operator asks the
API server once, at start (`nodes_readable`); without the permission it does not watch them, the
snapshot's nodes are None, and neither node loss nor drains are handled (`NODES_UNREADABLE`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pg_operator import objects
from pg_operator.controller.kube_api import Api, allowed

# What the operator does with Nodes (deploy/operator/rbac.yaml, the chart's ClusterRole): list and watch.
NODE_VERBS = ("list", "watch")
NODES_UNREADABLE = (
    "this operator may not list and watch Nodes (a namespaced install): an instance on a lost node is "
    "neither reported nor replaced, node drains are not handled (a drain of the primary's node evicts it, "
    "a failover rather than a switchover) and spec.affinity.podAntiAffinity: auto means preferred "
    "(docs/high-availability.md)"
)


async def nodes_readable(api: Api) -> bool:
    """Whether the API server's authorizer lets this operator list and watch Nodes."""
    return await allowed(api, "", "nodes", NODE_VERBS)


def pods_on(pods: Iterable[dict[str, Any]], node: str) -> bool:
    return any(objects.spec(p).get("nodeName") == node for p in pods)
