"""PodDisruptionBudget: only with more than one instance, so a single-instance cluster never blocks a node
drain (a top complaint against other operators)."""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_INSTANCE, child_metadata, selector_labels


def pdb(cluster: PostgresCluster) -> dict[str, Any] | None:
    if cluster.spec.replicas <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(cluster, names.pdb(cluster), COMPONENT_INSTANCE),
        "spec": {
            "minAvailable": 1,
            "selector": {"matchLabels": selector_labels(cluster)},
            # A pod that is not ready protects nothing; letting a drain evict it keeps drains from hanging
            # on a crash-looping instance.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
