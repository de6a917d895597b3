"""Labels, owner references and the metadata block every child carries."""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import API_VERSION, CLUSTER_LABEL, KIND

APP_NAME = "postgresql"
MANAGED_BY = "pg-operator"

# app.kubernetes.io/component values
COMPONENT_INSTANCE = "instance"  # StatefulSet, pods, PVCs, PDB
COMPONENT_SERVICE = "service"
COMPONENT_CONFIG = "config"
COMPONENT_RBAC = "rbac"
COMPONENT_CREDENTIALS = "credentials"


def selector_labels(cluster: PostgresCluster) -> dict[str, str]:
    """Labels that select the cluster's instance pods. Part of the StatefulSet's immutable selector: never
    add to them, or existing StatefulSets could no longer be updated."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": cluster.name,
        CLUSTER_LABEL: cluster.name,
    }


def child_labels(cluster: PostgresCluster, component: str) -> dict[str, str]:
    return {
        **selector_labels(cluster),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/version": cluster.spec.version,
    }


def owner_reference(cluster: PostgresCluster) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": cluster.name,
        "uid": cluster.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(cluster: PostgresCluster, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": cluster.namespace,
        "labels": child_labels(cluster, component),
        "annotations": {},
        "ownerReferences": [owner_reference(cluster)],
    }
