"""Which PostgresCluster an object belongs to: the wake-up mapping from any watched object to its cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, GROUP, KIND

# (namespace, name) of a PostgresCluster: the unit of reconciliation.
ClusterKey = tuple[str, str]


def cluster_key_of_cluster(body: Mapping[str, Any]) -> ClusterKey:
    return (objects.namespace(body), objects.name(body))


def owning_cluster_name(body: Mapping[str, Any]) -> str | None:
    """The name of the PostgresCluster that is this object's controller owner, if any."""
    for ref in objects.owner_references(body):
        api_version = str(ref.get("apiVersion") or "")
        if ref.get("kind") == KIND and api_version.split("/")[0] == GROUP and ref.get("controller"):
            name = ref.get("name")
            return str(name) if name else None
    return None


def cluster_key_of_child(body: Mapping[str, Any]) -> ClusterKey | None:
    """Map a child (or a pod/PVC of the cluster's StatefulSet) to its cluster.

    The controller ownerReference wins; the cluster label covers objects owned by something else
    (pods and PVCs belong to the StatefulSet, not to the cluster).
    """
    namespace = objects.namespace(body)
    if not namespace:
        return None
    name = owning_cluster_name(body) or objects.label(body, CLUSTER_LABEL)
    return (namespace, name) if name else None


def is_owned_by(body: Mapping[str, Any], cluster_uid: str) -> bool:
    """True when the cluster with this uid is the object's controller owner (what we may delete)."""
    return any(
        ref.get("uid") == cluster_uid and ref.get("controller") and ref.get("kind") == KIND
        for ref in objects.owner_references(body)
    )
