"""ServiceAccount, Role and RoleBinding of the instance pods: exactly what Patroni's Kubernetes DCS needs
(ConfigMaps mode, role label on pods), in the cluster's namespace only, and by name wherever Kubernetes
can restrict a verb by name.

What Patroni 4 does with its service account in ConfigMaps mode (`use_endpoints: false`, no
`bypass_api_service`), checked against its source (patroni/dcs/kubernetes.py):
- pods: lists and watches the members by label selector (a name cannot restrict list or watch), and
  patches its own pod's labels and status annotation (strategic merge patch). It never gets, updates,
  creates or deletes pods.
- ConfigMaps: lists and watches them by label selector; creates `<scope>-leader`, `-config`,
  `-failover` and `-sync` (create cannot be restricted by name); patches them, always by name; reads
  `<scope>-leader` by name after a conflicting leader update. The initialize key, history and the
  failsafe topology are annotations of `-config` and `-leader`, not objects of their own. It deletes
  ConfigMaps only in `patronictl remove` (a delete collection), which nothing in the pods runs.
- No Endpoints and no Service: those are written only in Endpoints mode.
"""

from __future__ import annotations

from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.cluster_sections import MAX_REPLICAS
from pg_operator.specs import names
from pg_operator.specs.labels import COMPONENT_RBAC, child_metadata

# Patroni's DCS objects are ConfigMaps named `<scope>-<suffix>`; the scope is the cluster's name.
PATRONI_CONFIGMAP_SUFFIXES = ("leader", "config", "failover", "sync")


def member_pod_names(cluster: PostgresCluster) -> list[str]:
    """Every pod the StatefulSet may ever run, up to the most replicas the API admits (a scale-up
    needs no new Role)."""
    return [f"{names.statefulset(cluster)}-{ordinal}" for ordinal in range(MAX_REPLICAS)]


def patroni_configmap_names(cluster: PostgresCluster) -> list[str]:
    return [f"{cluster.name}-{suffix}" for suffix in PATRONI_CONFIGMAP_SUFFIXES]


def patroni_rules(cluster: PostgresCluster) -> list[dict[str, Any]]:
    """The Role's rules: the verbs a name can restrict are given by name, list/watch/create cannot be."""
    core = [""]
    return [
        {"apiGroups": core, "resources": ["pods"], "verbs": ["list", "watch"]},
        {
            "apiGroups": core,
            "resources": ["pods"],
            "resourceNames": member_pod_names(cluster),
            "verbs": ["patch"],
        },
        {"apiGroups": core, "resources": ["configmaps"], "verbs": ["list", "watch", "create"]},
        {
            "apiGroups": core,
            "resources": ["configmaps"],
            "resourceNames": patroni_configmap_names(cluster),
            "verbs": ["get", "patch"],
        },
    ]


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
        "rules": patroni_rules(cluster),
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
