"""Retention decisions: which backups a policy lets go, and never the newest."""

from __future__ import annotations

import datetime as dt

import pytest

from pg_operator.backup.retention import BackupRecord, RetentionPolicy, obsolete_backups

NOW = dt.datetime(2026, 12, 31, 12, 0, tzinfo=dt.UTC)


def done(day: int, backup_id: str | None = None) -> BackupRecord:
    end = dt.datetime(2026, 12, day, 3, 10, tzinfo=dt.UTC)
    return BackupRecord(backup_id or f"202612{day:02d}T030000", end, "DONE")


def test_keep_last() -> None:
    backups = [done(d) for d in (1, 2, 3, 4, 5)]
    assert obsolete_backups(backups, RetentionPolicy(keep_last=2), NOW) == [b.backup_id for b in backups[:3]]
    assert obsolete_backups(backups, RetentionPolicy(keep_last=5), NOW) == []
    assert obsolete_backups(backups, RetentionPolicy(keep_last=9), NOW) == []


def test_recovery_window_keeps_the_base_of_the_windows_start() -> None:
    backups = [done(d) for d in (1, 10, 20, 25, 30)]
    # Window starts Dec 24 12:00: backups of the 25th and 30th are inside; the 20th is the base the window's
    # first hours replay from; the 1st and 10th go.
    assert obsolete_backups(backups, RetentionPolicy(recovery_window="7d"), NOW) == [
        backups[0].backup_id,
        backups[1].backup_id,
    ]
    assert obsolete_backups(backups, RetentionPolicy(recovery_window="1m"), NOW) == []
    assert obsolete_backups(backups, RetentionPolicy(recovery_window="2w"), NOW) == [backups[0].backup_id]


def test_the_newest_is_never_deleted() -> None:
    only = [done(1)]
    assert obsolete_backups(only, RetentionPolicy(recovery_window="1d"), NOW) == []
    assert obsolete_backups(only, RetentionPolicy(keep_last=1), NOW) == []
    old = [done(1), done(2)]
    assert obsolete_backups(old, RetentionPolicy(recovery_window="1d"), NOW) == [old[0].backup_id]


def test_running_and_failed_backups() -> None:
    running = BackupRecord("20261231T110000", None, "STARTED")
    failed_old = BackupRecord("20261201T090000", dt.datetime(2026, 12, 1, 9, 5, tzinfo=dt.UTC), "FAILED")
    failed_new = BackupRecord("20261230T090000", dt.datetime(2026, 12, 30, 9, 5, tzinfo=dt.UTC), "FAILED")
    backups = [done(1), failed_old, done(20), done(30), failed_new, running]
    doomed = obsolete_backups(backups, RetentionPolicy(keep_last=2), NOW)
    # Failed ones older than the oldest kept go; the running one and recent failures stay.
    assert doomed == [done(1).backup_id, failed_old.backup_id]
    assert obsolete_backups([running, failed_old], RetentionPolicy(keep_last=1), NOW) == []


def test_order_of_input_does_not_matter() -> None:
    backups = [done(d) for d in (5, 1, 4, 2, 3)]
    assert obsolete_backups(backups, RetentionPolicy(keep_last=2), NOW) == [
        done(d).backup_id for d in (1, 2, 3)
    ]


@pytest.mark.parametrize(
    ("policy", "barman"),
    [
        (RetentionPolicy(keep_last=3), "REDUNDANCY 3"),
        (RetentionPolicy(recovery_window="7d"), "RECOVERY WINDOW OF 7 DAYS"),
        (RetentionPolicy(recovery_window="4w"), "RECOVERY WINDOW OF 4 WEEKS"),
        (RetentionPolicy(recovery_window="3m"), "RECOVERY WINDOW OF 3 MONTHS"),
    ],
)
def test_barman_words(policy: RetentionPolicy, barman: str) -> None:
    assert policy.barman_policy() == barman


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"keep_last": 2, "recovery_window": "7d"}, "exactly one"),
        ({"recovery_window": "7x"}, "retention.recoveryWindow"),
        ({"recovery_window": "0d"}, "retention.recoveryWindow"),
        ({"keep_last": 0}, "retention.keepLast"),
    ],
)
def test_bad_policies(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]
