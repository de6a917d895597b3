"""PodDisruptionBudgets of the instances: what a node drain (an eviction) may take, and when.

With more than one instance, two budgets with disjoint selectors (a pod under two budgets cannot be
evicted at all):
- `<name>-primary` selects the pod labelled role=primary and keeps it (minAvailable 1 of the one pod): a
  drain of the primary's node retries (every 5 s) until the operator has switched over to a replica on
  another node (controller/reconcilers/drains.py); the old primary, labelled replica by then, goes under
- `<name>`, the replicas' budget: one replica evicted at a time (minAvailable: the replicas less one).
Both count in pods, not as maxUnavailable: with maxUnavailable the disruption controller counts the
StatefulSet's whole size as the pods expected, so a budget over the replicas alone would never allow an
eviction (3 expected, 2 healthy, 3 - 1 wanted).
An operator that may not read Nodes (a namespaced install without that grant) never learns of a drain:
then `<name>` alone keeps one instance of any role available (minAvailable 1), as before drains were
handled, and a drain may evict the primary (a failover, not a switchover).

One instance: no budget by default, so a drain is never held up by a cluster that cannot move its
primary anywhere (a top complaint against other operators); spec.disruption.singleInstance: Block keeps
the primary's budget, and the drain waits for the user (docs/high-availability.md#drains).

A pod that is not ready protects nothing: every budget lets a drain evict it
(unhealthyPodEvictionPolicy AlwaysAllow), so drains never hang on a crash-looping instance.
"""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import ROLE_LABEL, ROLE_PRIMARY, ROLE_REPLICA
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_INSTANCE, child_metadata, selector_labels


def _budget(cluster: PostgresCluster, name: str, role: str | None, limit: dict[str, int]) -> dict[str, Any]:
    selector = selector_labels(cluster)
    if role is not None:
        selector = {**selector, ROLE_LABEL: role}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(cluster, name, COMPONENT_INSTANCE),
        "spec": {
            **limit,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def pdbs(cluster: PostgresCluster, *, drains_handled: bool = True) -> list[dict[str, Any]]:
    """The instances' budgets (module docstring). `drains_handled`: the operator reads Nodes, so it
    switches over away from a node being drained."""
    if cluster.spec.replicas <= 1:
        if cluster.spec.disruption.single_instance == "Block":
            return [_budget(cluster, names.primary_pdb(cluster), ROLE_PRIMARY, {"minAvailable": 1})]
        return []
    if not drains_handled:
        return [_budget(cluster, names.pdb(cluster), None, {"minAvailable": 1})]
    return [
        _budget(cluster, names.primary_pdb(cluster), ROLE_PRIMARY, {"minAvailable": 1}),
        _budget(cluster, names.pdb(cluster), ROLE_REPLICA, {"minAvailable": cluster.spec.replicas - 2}),
    ]
