"""The primary's archiving report: what it publishes, when, and what the operator shows of it."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

from pg_operator.backup.archive_health import ArchiverStats, archiving_condition, archiving_summary
from pg_operator.backup.archive_report import (
    ARCHIVE_REPORT_ANNOTATION,
    REFRESH_SECONDS,
    ArchiveReport,
    annotation_patch,
    backlog_bucket,
    parse_report,
    settled,
    should_publish,
)

T0 = dt.datetime(2026, 12, 3, 7, 0, tzinfo=dt.UTC)
GATE = "archive 0123456789abcdef"


def stats(**kw: object) -> ArchiverStats:
    base: dict[str, object] = dict(archived_count=5, last_archived_wal="000000010000000000000005",
                                   last_archived_time=T0, failed_count=0, last_failed_wal="",
                                   last_failed_time=None, pending=0)  # fmt: skip
    base.update(kw)
    return ArchiverStats(**base)  # type: ignore[arg-type]


def test_backlog_is_bucketed_by_doubling() -> None:
    assert [backlog_bucket(n) for n in (0, 1, 3, 4, 7, 8, 100)] == [0, 0, 0, 4, 4, 8, 64]


def test_report_round_trips_through_the_annotation() -> None:
    failed = T0 + dt.timedelta(seconds=30)
    report = ArchiveReport(GATE, stats(failed_count=2, last_failed_wal="000000010000000000000006",
                                       last_failed_time=failed, pending=9))  # fmt: skip
    patch = annotation_patch(report)
    value = patch["metadata"]["annotations"][ARCHIVE_REPORT_ANNOTATION]
    back = parse_report({ARCHIVE_REPORT_ANNOTATION: value})
    assert back is not None and back.gate == GATE
    assert back.stats == replace(report.stats, pending=8)  # the backlog as published
    assert back.stats.failing


def test_a_standby_removes_the_report_and_garbage_reads_as_none() -> None:
    assert annotation_patch(None) == {"metadata": {"annotations": {ARCHIVE_REPORT_ANNOTATION: None}}}
    assert parse_report(None) is None
    assert parse_report({ARCHIVE_REPORT_ANNOTATION: "not json"}) is None
    assert parse_report({ARCHIVE_REPORT_ANNOTATION: json.dumps([1])}) is None
    assert parse_report({ARCHIVE_REPORT_ANNOTATION: json.dumps({"archivedCount": "x"})}) is None


def test_state_changes_publish_at_once_progress_only_after_the_refresh() -> None:
    last = ArchiveReport(GATE, stats())
    later = T0 + dt.timedelta(seconds=60)
    moved = ArchiveReport(GATE, stats(archived_count=6, last_archived_wal="000000010000000000000006",
                                      last_archived_time=later, pending=2))  # fmt: skip
    assert should_publish(None, last, 0.0)
    assert not should_publish(last, last, 3600.0)  # nothing moved: never
    assert not should_publish(last, moved, 5.0)  # one more segment, a backlog of 2: not yet
    assert should_publish(last, moved, REFRESH_SECONDS)
    assert should_publish(last, replace(last, gate=""), 0.0)  # a restarted container lost the gate
    failing = ArchiveReport(GATE, stats(failed_count=1, last_failed_wal="000000010000000000000006",
                                        last_failed_time=T0 + dt.timedelta(seconds=5)))  # fmt: skip
    assert should_publish(last, failing, 0.0)
    assert should_publish(last, ArchiveReport(GATE, stats(pending=4)), 0.0)  # the backlog grows
    assert not should_publish(last, ArchiveReport(GATE, stats(pending=3)), 0.0)


def test_status_keeps_its_figures_while_the_state_holds() -> None:
    first = stats()
    previous = archiving_summary(first, "db-0")
    later = stats(archived_count=50, last_archived_wal="000000010000000000000032",
                  last_archived_time=T0 + dt.timedelta(hours=2), pending=1)  # fmt: skip
    shown = settled(later, "db-0", previous)
    assert archiving_summary(shown, "db-0") == previous  # no status write for progress alone
    assert archiving_condition(shown, primary="db-0") == archiving_condition(first, primary="db-0")
    # A new primary, a failure, a growing backlog: the new figures.
    assert settled(later, "db-1", previous) == later
    failing = replace(later, failed_count=1, last_failed_wal="000000010000000000000033",
                      last_failed_time=T0 + dt.timedelta(hours=3))  # fmt: skip
    assert settled(failing, "db-0", previous) == failing
    assert settled(replace(later, pending=16), "db-0", previous).pending == 16


def test_an_old_failure_does_not_turn_kept_figures_into_failing() -> None:
    # A failure at 07:30 then a success at 07:31: healthy. The status from 07:00 stays as it was.
    previous = archiving_summary(stats(), "db-0")
    now = stats(archived_count=9, last_archived_time=T0 + dt.timedelta(minutes=31), failed_count=1,
                last_failed_wal="000000010000000000000007",
                last_failed_time=T0 + dt.timedelta(minutes=30))  # fmt: skip
    shown = settled(now, "db-0", previous)
    assert not shown.failing
    assert archiving_summary(shown, "db-0") == previous


def test_failing_keeps_the_first_failure_time_while_the_same_segment_fails() -> None:
    failing = stats(failed_count=3, last_failed_wal="000000010000000000000006",
                    last_failed_time=T0 + dt.timedelta(minutes=1))  # fmt: skip
    previous = archiving_summary(failing, "db-0")
    again = replace(failing, failed_count=9, last_failed_time=T0 + dt.timedelta(minutes=5))
    shown = settled(again, "db-0", previous)
    assert shown.failing and archiving_summary(shown, "db-0") == previous
