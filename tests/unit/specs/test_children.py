"""desired_children: every child, in apply order, owned by the cluster and labelled."""

from __future__ import annotations

from typing import Any

from harness.objects import cluster_model as cluster
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_LABEL
from pg_operator.specs import CHILD_KINDS, MANAGED_KINDS, desired_children, selector_labels


def by_kind(children: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in children}


def test_apply_order_and_names() -> None:
    got = [(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in desired_children(cluster())]
    assert got == [
        ("v1", "ServiceAccount", "orders-db-instance"),
        ("rbac.authorization.k8s.io/v1", "Role", "orders-db-instance"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "orders-db-instance"),
        ("v1", "ConfigMap", "orders-db-instance"),
        ("v1", "Service", "orders-db"),
        ("v1", "Service", "orders-db-rw"),
        ("v1", "Service", "orders-db-ro"),
        ("v1", "Service", "orders-db-r"),
        ("apps/v1", "StatefulSet", "orders-db"),
        ("policy/v1", "PodDisruptionBudget", "orders-db"),
        ("networking.k8s.io/v1", "NetworkPolicy", "orders-db"),
    ]


def test_every_child_has_the_controller_owner_reference_and_labels() -> None:
    for child in desired_children(cluster()):
        meta = child["metadata"]
        where = f"{child['kind']}/{meta['name']}"
        assert meta["namespace"] == "shop", where
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "db.example.com/v1alpha1",
                "kind": "PostgresCluster",
                "name": "orders-db",
                "uid": "uid-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], where
        labels = meta["labels"]
        assert labels[CLUSTER_LABEL] == "orders-db", where
        assert labels["app.kubernetes.io/name"] == "postgresql", where
        assert labels["app.kubernetes.io/instance"] == "orders-db", where
        assert labels["app.kubernetes.io/managed-by"] == "pg-operator", where
        assert labels["app.kubernetes.io/version"] == "16", where
        assert labels["app.kubernetes.io/component"], where
        assert isinstance(meta["annotations"], dict), where


def test_pdb_only_with_more_than_one_instance() -> None:
    assert ("PodDisruptionBudget", "orders-db") not in by_kind(desired_children(cluster(replicas=1)))
    for n in (2, 3, 5):
        pdb = by_kind(desired_children(cluster(replicas=n)))[("PodDisruptionBudget", "orders-db")]
        assert pdb["spec"]["minAvailable"] == 1
        assert pdb["spec"]["selector"] == {"matchLabels": selector_labels(cluster())}


def test_kinds_cover_every_child_and_secrets() -> None:
    kinds = {(c["apiVersion"], c["kind"]) for c in desired_children(cluster())}
    assert kinds == set(CHILD_KINDS)
    assert set(MANAGED_KINDS) == set(CHILD_KINDS) | {
        ("v1", "Secret"),
        ("apps/v1", "Deployment"),
        ("batch/v1", "Job"),
    }


def test_builders_are_deterministic() -> None:
    assert desired_children(cluster()) == desired_children(cluster())


def test_rbac_is_what_patroni_needs_in_the_namespace_only() -> None:
    children = by_kind(desired_children(cluster()))
    role = children[("Role", "orders-db-instance")]
    assert role["metadata"]["namespace"] == "shop"
    # The rules themselves: tests/unit/specs/test_rbac.py.
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"pods", "configmaps"}
    assert all(r["apiGroups"] == [""] for r in role["rules"])
    binding = children[("RoleBinding", "orders-db-instance")]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "orders-db-instance",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "orders-db-instance", "namespace": "shop"}
    ]


def test_services_select_by_role() -> None:
    children = by_kind(desired_children(cluster()))
    pods = selector_labels(cluster())
    headless = children[("Service", "orders-db")]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert headless["selector"] == pods
    assert {p["name"]: p["port"] for p in headless["ports"]} == {"postgresql": 5432, "patroni": 8008}
    rw = children[("Service", "orders-db-rw")]["spec"]
    ro = children[("Service", "orders-db-ro")]["spec"]
    r = children[("Service", "orders-db-r")]["spec"]
    assert rw["selector"] == {**pods, ROLE_LABEL: "primary"}
    assert ro["selector"] == {**pods, ROLE_LABEL: "replica"}
    assert r["selector"] == pods and r["publishNotReadyAddresses"] is False
    for svc in (rw, ro, r):
        assert "clusterIP" not in svc and svc["type"] == "ClusterIP"
        assert svc["ports"] == [
            {"name": "postgresql", "port": 5432, "targetPort": "postgresql", "protocol": "TCP"}
        ]
