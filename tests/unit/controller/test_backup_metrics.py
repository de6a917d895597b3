"""The operator's base-backup series the backup alerts read: set per cluster, removed when the cluster
(or its backups) go, so an alert never fires on a stale value."""

from __future__ import annotations

from pg_operator.controller.metrics import Metrics

KEY = ("shop", "db")
LABELS = {"namespace": "shop", "cluster": "db"}


def sample(m: Metrics, name: str) -> float | None:
    return m.registry.get_sample_value(name, LABELS)


def test_success_time_and_outcome_are_served_then_removed() -> None:
    m = Metrics()
    assert sample(m, "pg_operator_backup_last_succeeded") is None
    m.set_backups(KEY, 1_700_000_000.0, True)
    assert sample(m, "pg_operator_backup_last_success_timestamp_seconds") == 1_700_000_000.0
    assert sample(m, "pg_operator_backup_last_succeeded") == 1.0
    # The newest finished backup failed: the time of the last success stays, the outcome turns 0.
    m.set_backups(KEY, 1_700_000_000.0, False)
    assert sample(m, "pg_operator_backup_last_succeeded") == 0.0
    assert sample(m, "pg_operator_backup_last_success_timestamp_seconds") == 1_700_000_000.0
    m.set_backups(("shop", "other"), None, False)  # never succeeded: only the outcome
    assert m.registry.get_sample_value("pg_operator_backup_last_success_timestamp_seconds",
                                       {"namespace": "shop", "cluster": "other"}) is None  # fmt: skip
    m.forget_archive(KEY)
    assert sample(m, "pg_operator_backup_last_succeeded") is None
    assert sample(m, "pg_operator_backup_last_success_timestamp_seconds") is None
    m.forget_archive(KEY)  # forgetting twice is harmless
    assert m.registry.get_sample_value("pg_operator_backup_last_succeeded",
                                       {"namespace": "shop", "cluster": "other"}) == 0.0  # fmt: skip
