"""The wake-up mapping: any watched object → the PostgresCluster to reconcile."""

from __future__ import annotations

from pg_operator.controller.keys import cluster_key_of_child, cluster_key_of_cluster, is_owned_by

OWNER = {
    "apiVersion": "db.example.com/v1alpha1",
    "kind": "PostgresCluster",
    "name": "orders-db",
    "uid": "u1",
    "controller": True,
    "blockOwnerDeletion": True,
}


def test_cluster_maps_to_itself() -> None:
    assert cluster_key_of_cluster({"metadata": {"namespace": "shop", "name": "orders-db"}}) == (
        "shop",
        "orders-db",
    )


def test_owned_child_maps_through_its_owner_reference() -> None:
    svc = {
        "kind": "Service",
        "metadata": {"namespace": "shop", "name": "orders-db-rw", "ownerReferences": [OWNER]},
    }
    assert cluster_key_of_child(svc) == ("shop", "orders-db")


def test_owner_reference_wins_over_the_label() -> None:
    obj = {
        "metadata": {
            "namespace": "shop",
            "name": "x",
            "ownerReferences": [OWNER],
            "labels": {"db.example.com/cluster": "other"},
        }
    }
    assert cluster_key_of_child(obj) == ("shop", "orders-db")


def test_pod_of_the_statefulset_maps_through_the_cluster_label() -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "namespace": "shop",
            "name": "orders-db-0",
            "labels": {"db.example.com/cluster": "orders-db"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": "orders-db",
                    "uid": "s1",
                    "controller": True,
                }
            ],
        },
    }
    assert cluster_key_of_child(pod) == ("shop", "orders-db")


def test_unrelated_objects_map_to_nothing() -> None:
    assert cluster_key_of_child({"metadata": {"namespace": "shop", "name": "x"}}) is None
    foreign = {
        "apiVersion": "other.io/v1",
        "kind": "PostgresCluster",
        "name": "y",
        "uid": "z",
        "controller": True,
    }
    assert (
        cluster_key_of_child({"metadata": {"namespace": "shop", "name": "x", "ownerReferences": [foreign]}})
        is None
    )
    # cluster-scoped objects have no namespace and cannot belong to a cluster
    assert (
        cluster_key_of_child({"metadata": {"name": "x", "labels": {"db.example.com/cluster": "a"}}}) is None
    )


def test_ownership_is_by_uid_and_controller_flag() -> None:
    obj = {"metadata": {"ownerReferences": [OWNER]}}
    assert is_owned_by(obj, "u1")
    assert not is_owned_by(obj, "u2")  # a cluster of the same name, recreated
    assert not is_owned_by({"metadata": {"ownerReferences": [{**OWNER, "controller": False}]}}, "u1")
    assert not is_owned_by({"metadata": {}}, "u1")
