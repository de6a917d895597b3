"""Retention decisions: which backups a policy lets go, and never the newest."""

from __future__ import annotations

import datetime as dt

import pytest

from pg_operator.backup.retention import (
    BackupRecord,
    RetentionPolicy,
    next_change,
    obsolete_backups,
    retired_backup_objects,
)

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


def test_a_window_changes_its_answer_only_when_its_start_passes_a_backups_end() -> None:
    backups = [done(d) for d in (1, 10, 20, 25, 30)]
    policy = RetentionPolicy(recovery_window="7d")
    upcoming = next_change(backups, policy, NOW)
    # A second after the 25th's end (03:10) plus 7 days: the window's start has passed that backup's end.
    assert upcoming == dt.datetime(2027, 1, 1, 3, 10, 1, tzinfo=dt.UTC)
    # Proved on the decision itself: the same answer up to that moment, another one from it on.
    same = obsolete_backups(backups, policy, NOW)
    assert obsolete_backups(backups, policy, upcoming - dt.timedelta(seconds=1)) == same
    assert obsolete_backups(backups, policy, upcoming) != same
    # Failed and running backups never set the moment; with every backup behind the window, none does.
    running = BackupRecord("20261231T110000", None, "STARTED")
    failed = BackupRecord("20261230T090000", dt.datetime(2026, 12, 30, 9, 5, tzinfo=dt.UTC), "FAILED")
    assert next_change([done(1), failed, running], policy, NOW) is None
    assert next_change([], policy, NOW) is None


def test_a_count_never_changes_its_answer_with_time() -> None:
    backups = [done(d) for d in (1, 10, 20, 25, 30)]
    policy = RetentionPolicy(keep_last=2)
    assert next_change(backups, policy, NOW) is None
    later = NOW + dt.timedelta(days=400)
    assert obsolete_backups(backups, policy, later) == obsolete_backups(backups, policy, NOW)


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


# --- the Backup objects of base backups retention removed --------------------------------------------

STORE = {"serverName": "orders-db", "destinationPath": "s3://backups/prod"}


def backup_object(name: str, day: int, *, phase: str = "Completed", **status: str) -> dict[str, object]:
    stopped = f"2026-12-{day:02d}T03:10:00Z"
    return {"metadata": {"name": name, "namespace": "shop"}, "spec": {"cluster": "orders-db"},
            "status": {"phase": phase, "backupID": f"202612{day:02d}T030000", "stoppedAt": stopped,
                       **STORE, **status}}  # fmt: skip


def retired(objects: list[dict[str, object]], remaining: list[BackupRecord]) -> list[str]:
    return retired_backup_objects(
        objects, remaining, cluster="orders-db", server_name="orders-db", destination_path="s3://backups/prod"
    )


def test_the_objects_of_removed_backups_are_retired() -> None:
    objects = [backup_object(f"b{d}", d) for d in (1, 2, 3, 4)]
    # keepLast 2 removed the 1st and the 2nd.
    assert retired(objects, [done(3), done(4)]) == ["b1", "b2"]
    assert retired(objects, [done(d) for d in (1, 2, 3, 4)]) == []


def test_a_backup_newer_than_the_listing_is_kept() -> None:
    # b5 completed after the store was listed: absent from the listing, but newer than all of it.
    objects = [backup_object("b1", 1), backup_object("b5", 5)]
    assert retired(objects, [done(3), done(4)]) == ["b1"]


def test_the_oldest_kept_is_kept_even_when_barman_times_have_fractions() -> None:
    kept = BackupRecord("20261203T030000", dt.datetime(2026, 12, 3, 3, 10, 0, 700000, tzinfo=dt.UTC), "DONE")
    assert retired([backup_object("b3", 3)], [kept]) == []
    assert retired([backup_object("gone", 3, backupID="20261202T030000")], [kept]) == []


def test_only_completed_objects_of_this_cluster_and_store_are_retired() -> None:
    other_cluster = backup_object("other", 1)
    other_cluster["spec"] = {"cluster": "billing-db"}
    objects = [
        other_cluster,
        backup_object("old-store", 1, destinationPath="s3://backups/old"),
        backup_object("renamed", 1, serverName="orders-db-2"),
        backup_object("failed", 1, phase="Failed"),
        backup_object("running", 1, phase="Running"),
        backup_object("no-id", 1, backupID=""),
        backup_object("mine", 1),
    ]
    assert retired(objects, [done(3)]) == ["mine"]


def test_nothing_is_retired_when_the_store_lists_no_completed_backup() -> None:
    objects = [backup_object("b1", 1)]
    assert retired(objects, []) == []
    assert retired(objects, [BackupRecord("20261203T030000", None, "STARTED")]) == []


def test_the_operator_flag_sets_how_long_a_failed_retention_waits() -> None:
    from pg_operator.cli.main import build_parser

    def retry(*argv: str) -> float:
        return float(build_parser().parse_args(["run", *argv]).backup_retention_retry)

    assert retry() == 600.0
    assert retry("--backup-retention-retry", "90s") == 90.0
    assert retry("--backup-retention-retry", "2m") == 120.0
    assert retry("--backup-retention-retry", "45") == 45.0
    for bad in ("0", "-5s", "ten", "8d"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", "--backup-retention-retry", bad])
