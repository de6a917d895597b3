"""ServiceAccount, Role and RoleBinding of the instance pods: exactly what Patroni's Kubernetes DCS needs
(ConfigMaps mode, role label on pods), in the cluster's namespace only."""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_RBAC, child_metadata

# Patroni reads its member pods and patches their role label and annotations; it keeps the leader lock,
# the dynamic configuration, failover and sync state in ConfigMaps it creates and may delete.
PATRONI_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "update"]},
    {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
)


def service_account(cluster: PostgresCluster) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": child_metadata(cluster, names.instance(cluster), COMPONENT_RBAC),
    }


def role(cluster: PostgresCluster) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": child_metadata(cluster, names.instance(cluster), COMPONENT_RBAC),
        "rules": [dict(rule) for rule in PATRONI_RULES],
    }


def role_binding(cluster: PostgresCluster) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": child_metadata(cluster, names.instance(cluster), COMPONENT_RBAC),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.instance(cluster)},
        "subjects": [
            {"kind": "ServiceAccount", "name": names.instance(cluster), "namespace": cluster.namespace}
        ],
    }
