"""Events name the object they are about: a Backup's Event points at the Backup, not at its cluster."""

from __future__ import annotations

from pg_operator.controller.events import event_body


def test_an_event_points_at_the_object_it_is_given() -> None:
    backup = {"apiVersion": "db.example.com/v1alpha1", "kind": "Backup",
              "metadata": {"name": "nightly", "namespace": "shop", "uid": "u1"}}
    body = event_body(backup, "Warning", "BackupFailed", "x" * 2000, "op-1")
    assert body["involvedObject"] == {"apiVersion": "db.example.com/v1alpha1", "kind": "Backup",
                                      "name": "nightly", "namespace": "shop", "uid": "u1"}
    assert body["metadata"] == {"generateName": "nightly.", "namespace": "shop"}
    assert len(body["message"]) == 1024 and body["reason"] == "BackupFailed"


def test_an_object_without_kind_is_taken_for_a_postgres_cluster() -> None:
    body = event_body({"metadata": {"name": "orders-db", "namespace": "shop"}}, "Normal", "Created", "", "op")
    assert body["involvedObject"]["kind"] == "PostgresCluster"
    assert body["involvedObject"]["apiVersion"] == "db.example.com/v1alpha1"
