"""Node drains (pure): when the primary's node is being drained, switch over to a replica on a node that
stays, before the drain may evict the primary.

The primary's PodDisruptionBudget allows no eviction (specs/pdb.py), so `kubectl drain` retries every
5 s; this decides the switchover that lets it through. The old primary, a replica after the switchover,
falls under the replicas' budget and is evicted like any replica.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import ROLE_PRIMARY
from pg_operator.orchestration.instances import Instance
from pg_operator.orchestration.nodes import NodeView
from pg_operator.orchestration.rollout import Action


def pod_nodes(pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Pod name -> the node it is bound to (spec.nodeName), for bound pods."""
    return {
        objects.name(p): str(objects.spec(p).get("nodeName")) for p in pods if objects.spec(p).get("nodeName")
    }


def primary_of(instances: Sequence[Instance]) -> Instance | None:
    """The primary: Patroni's leader where its view is known (the pods' role labels trail a switchover
    for a moment, and a second switchover must not follow the first), else the pod labelled primary."""
    leader = next((i for i in instances if i.member is not None and i.member.is_leader), None)
    if leader is not None:
        return leader
    return next((i for i in instances if i.role == ROLE_PRIMARY and not i.terminating), None)


def draining_primary_node(
    instances: Sequence[Instance], pods: Sequence[Mapping[str, Any]], nodes: Sequence[NodeView] | None
) -> NodeView | None:
    """The node being drained that the running primary is on; None when there is none (or the Nodes are
    not known)."""
    if not nodes:
        return None
    primary = primary_of(instances)
    if primary is None:
        return None
    where = pod_nodes(pods).get(primary.name)
    node = next((n for n in nodes if n.name == where), None)
    return node if node is not None and node.draining else None


def plan_drain(
    instances: Sequence[Instance], pods: Sequence[Mapping[str, Any]], nodes: Sequence[NodeView] | None
) -> Action | None:
    """The step for a primary on a node being drained: a switchover to the healthiest replica on a node
    that is Ready and not being drained, or a wait naming why there is none. None: the primary's node is
    not being drained. `instances` carry Patroni's member view (healthy_replica, sync standbys)."""
    node = draining_primary_node(instances, pods, nodes)
    if node is None:
        return None
    where = pod_nodes(pods)
    by_name = {n.name: n for n in nodes or ()}

    def stays(instance: Instance) -> bool:
        host = by_name.get(where.get(instance.name, ""))
        return host is not None and host.ready is True and not host.draining

    primary = primary_of(instances)
    assert primary is not None  # draining_primary_node found it
    # When Patroni names synchronous standbys it switches over to no other: a standby being drained
    # too leaves none here, and the drain evicts it first (the replicas' budget), then Patroni names another.
    sync_named = any(i.member is not None and i.member.is_sync for i in instances)
    pool = [
        i
        for i in instances
        if i is not primary
        and i.healthy_replica
        and stays(i)
        and (not sync_named or (i.member is not None and i.member.is_sync))
    ]
    candidate = min(pool, key=lambda i: (i.lag, i.ordinal), default=None)
    if len(instances) <= 1:
        return Action("wait", reason=f"node {node.name} of the only instance {primary.name} is being drained")
    if candidate is None:
        return Action(
            "wait",
            reason=(
                f"node {node.name} of primary {primary.name} is being drained: waiting for a streaming "
                "replica on a node that is Ready and not being drained to switch over to"
            ),
        )
    return Action(
        "switchover",
        target=candidate.name,
        reason=(
            f"node {node.name} of primary {primary.name} is being drained: switching over to "
            f"{candidate.name} on node {where[candidate.name]}"
        ),
    )
