"""Events name the object they are about: a Backup's Event points at the Backup, not at its cluster."""

from __future__ import annotations

from typing import Any, cast

from pg_operator.controller.events import RECENT_SECONDS, EventRecorder, event_body


def test_an_event_points_at_the_object_it_is_given() -> None:
    backup = {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "Backup",
        "metadata": {"name": "nightly", "namespace": "shop", "uid": "u1"},
    }
    body = event_body(backup, "Warning", "BackupFailed", "x" * 2000, "op-1")
    assert body["involvedObject"] == {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "Backup",
        "name": "nightly",
        "namespace": "shop",
        "uid": "u1",
    }
    assert body["metadata"] == {"generateName": "nightly.", "namespace": "shop"}
    assert len(body["message"]) == 1024 and body["reason"] == "BackupFailed"


def test_an_object_without_kind_is_taken_for_a_postgres_cluster() -> None:
    body = event_body({"metadata": {"name": "orders-db", "namespace": "shop"}}, "Normal", "Created", "", "op")
    assert body["involvedObject"]["kind"] == "PostgresCluster"
    assert body["involvedObject"]["apiVersion"] == "db.example.com/v1alpha1"


class Posted:
    def __init__(self) -> None:
        self.bodies: list[Any] = []

    async def create(self, obj: Any) -> None:
        self.bodies.append(obj)


async def test_a_warning_a_reconciler_posted_stands_for_the_degraded_transition_for_a_minute() -> None:
    now = [100.0]
    recorder = EventRecorder(cast(Any, Posted()), "op", clock=lambda: now[0])
    cluster = {"metadata": {"name": "db", "namespace": "shop", "uid": "u1"}}
    other = {"metadata": {"name": "db2", "namespace": "shop", "uid": "u2"}}
    assert not recorder.warned_recently(cluster, "MajorUpgradeCheckFailed")
    assert await recorder.record(cluster, "Warning", "MajorUpgradeCheckFailed", "refused, still serving 16")
    await recorder.record(cluster, "Normal", "Recovered", "no longer degraded")
    assert recorder.warned_recently(cluster, "MajorUpgradeCheckFailed")
    assert not recorder.warned_recently(cluster, "Recovered")  # only Warnings
    assert not recorder.warned_recently(other, "MajorUpgradeCheckFailed")  # only this object
    now[0] += RECENT_SECONDS
    assert not recorder.warned_recently(cluster, "MajorUpgradeCheckFailed")
