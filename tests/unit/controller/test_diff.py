"""What counts as a difference between what we would apply and what the API server holds."""

from __future__ import annotations

import copy
from typing import Any

from pg_operator.controller.diff import (
    HASH_ANNOTATION,
    desired_hash,
    differences,
    object_differences,
    parse_quantity,
    with_hash,
)


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "orders-db-rw",
            "namespace": "shop",
            "labels": {"db.example.com/cluster": "orders-db"},
            "ownerReferences": [
                {
                    "apiVersion": "db.example.com/v1alpha1",
                    "kind": "PostgresCluster",
                    "name": "orders-db",
                    "uid": "u1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "selector": {"db.example.com/cluster": "orders-db", "role": "primary"},
            "ports": [{"name": "postgresql", "port": 5432, "targetPort": "postgresql"}],
            "publishNotReadyAddresses": False,
        },
    }


def as_stored(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns after applying `desired`: defaults added, false/empty omitted."""
    obs = copy.deepcopy(with_hash(desired))
    obs["metadata"].update(uid="x", resourceVersion="7", managedFields=[{"manager": "pg-operator"}])
    spec = obs["spec"]
    spec.pop("publishNotReadyAddresses")
    spec.update(type="ClusterIP", clusterIP="10.96.0.12", sessionAffinity="None")
    spec["ports"][0]["protocol"] = "TCP"
    obs["status"] = {"loadBalancer": {}}
    return obs


def test_server_defaults_and_omitted_false_are_not_differences() -> None:
    desired = service()
    assert object_differences(with_hash(desired), as_stored(desired)) == []


def test_missing_object_differs() -> None:
    assert object_differences(service(), None) == ["<missing>"]


def test_drift_in_a_field_we_set_is_found() -> None:
    desired = service()
    observed = as_stored(desired)
    observed["spec"]["selector"]["role"] = "replica"
    assert object_differences(with_hash(desired), observed) == ["spec.selector.role"]


def test_label_removed_by_someone_else_is_found() -> None:
    desired = service()
    observed = as_stored(desired)
    del observed["metadata"]["labels"]["db.example.com/cluster"]
    assert object_differences(desired, observed) == ["metadata.labels.db.example.com/cluster"]


def test_changed_intent_is_found_through_the_hash_even_when_a_field_was_dropped() -> None:
    old = service()
    old["metadata"]["labels"]["extra"] = "1"
    observed = as_stored(old)
    new = service()  # we stopped setting the "extra" label: a subset comparison alone cannot see it
    assert object_differences(with_hash(new), observed) == [f"metadata.annotations.{HASH_ANNOTATION}"]


def test_hash_ignores_its_own_annotation_and_key_order() -> None:
    a = service()
    b = {k: a[k] for k in reversed(list(a))}
    assert desired_hash(a) == desired_hash(b) == desired_hash(with_hash(a))
    changed = service()
    changed["spec"]["ports"][0]["port"] = 5433
    assert desired_hash(changed) != desired_hash(a)


def test_quantities_compare_by_value() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1024Mi")
    assert parse_quantity("500m") == parse_quantity("0.5")
    assert parse_quantity("1e3") == parse_quantity("1k")
    assert parse_quantity("postgresql") is None
    want = {"resources": {"limits": {"cpu": "1000m", "memory": "1Gi"}}}
    assert differences(want, {"resources": {"limits": {"cpu": "1", "memory": "1073741824"}}}) == []
    assert differences(want, {"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}) == [
        "resources.limits.cpu"
    ]


def test_keyed_lists_tolerate_items_others_added_but_not_missing_ones() -> None:
    want = {"containers": [{"name": "postgres", "image": "pg:16"}]}
    got = {
        "containers": [
            {"name": "sidecar", "image": "x"},
            {"name": "postgres", "image": "pg:16", "terminationMessagePath": "/dev/x"},
        ]
    }
    assert differences(want, got) == []
    assert differences(want, {"containers": [{"name": "sidecar"}]}) == ["containers[name=postgres]"]
    assert differences(want, {"containers": [{"name": "postgres", "image": "pg:15"}]}) == [
        "containers[name=postgres].image"
    ]


def test_unkeyed_lists_compare_by_position_and_length() -> None:
    assert differences({"args": ["a", "b"]}, {"args": ["a", "b"]}) == []
    assert differences({"args": ["a", "b"]}, {"args": ["b", "a"]}) == ["args[0]", "args[1]"]
    assert differences({"args": ["a"]}, {"args": ["a", "b"]}) == ["args"]


def test_types_are_not_coerced_except_quantities() -> None:
    assert differences({"port": 5432}, {"port": "5432"}) == []  # int-or-string quantities
    assert differences({"enabled": True}, {"enabled": "true"}) == ["enabled"]
    assert differences({"minAvailable": 1}, {"minAvailable": 2}) == ["minAvailable"]


def test_empty_desired_values_match_absent_ones() -> None:
    assert differences({"emptyDir": {}, "items": [], "flag": False, "n": 0}, {}) == []
    assert differences({"securityContext": {"runAsNonRoot": True}}, {}) == ["securityContext"]


def test_statefulset_hash_ignores_the_immutable_fields_copied_from_the_server() -> None:
    built = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "a"},
        "spec": {
            "replicas": 3,
            "serviceName": "a",
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}],
        },
    }
    copied = copy.deepcopy(built)
    copied["spec"]["volumeClaimTemplates"][0].update(
        apiVersion="v1", kind="PersistentVolumeClaim", status={"phase": "Pending"}
    )
    assert desired_hash(built) == desired_hash(copied)
    scaled = copy.deepcopy(built)
    scaled["spec"]["replicas"] = 5
    assert desired_hash(scaled) != desired_hash(built)
