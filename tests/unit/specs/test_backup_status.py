"""The backup controller's part of the cluster status survives the cluster's own status computation."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from harness.objects import cluster_model
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.cluster_status import PostgresClusterStatus
from pg_operator.specs import compute_status

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)


def cluster() -> PostgresCluster:
    return cluster_model(replicas=1, storage="1Gi")


def backup_condition(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "m", "observedGeneration": 1,
            "lastTransitionTime": "2026-12-01T07:00:00Z"}  # fmt: skip


def test_backup_conditions_and_fields_are_carried_over_unchanged() -> None:
    first = compute_status(cluster(), previous=None, statefulset=None, pods=[], now=T0)
    archiving = backup_condition("ContinuousArchiving", "False", "InvalidCredentials")
    last = backup_condition("LastBackupSucceeded", "True", "BackupCompleted")
    backup = {"archiving": {"pendingWAL": 7, "lastFailedWAL": "000000010000000000000003"}}
    previous = {**first, "conditions": [last, *first["conditions"], archiving], "backup": backup}
    again = compute_status(cluster(), previous=previous, statefulset=None, pods=[], now=T0)
    types = [c["type"] for c in again["conditions"]]
    assert types == ["Ready", "Progressing", "Degraded", "ContinuousArchiving", "LastBackupSucceeded"]
    assert again["conditions"][3] == archiving and again["conditions"][4] == last
    assert again["backup"] == backup
    # The CRD's status model accepts them (the API server would otherwise refuse the write).
    parsed = PostgresClusterStatus.model_validate(again)
    assert parsed.backup is not None and parsed.backup.archiving is not None
    assert parsed.backup.archiving.pending_wal == 7


def test_no_backup_part_without_a_previous_one() -> None:
    status = compute_status(cluster(), previous=None, statefulset=None, pods=[], now=T0)
    assert "backup" not in status
    assert [c["type"] for c in status["conditions"]] == ["Ready", "Progressing", "Degraded"]
