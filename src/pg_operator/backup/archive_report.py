"""What a primary publishes about its own WAL archiving, in its pod's annotation (pure).

The instance reads pg_stat_archiver and the archive gate's file itself, every few seconds, and patches its
own pod's annotation `ARCHIVE_REPORT_ANNOTATION` when what it says changes. The operator learns archive
health from the pod it already watches, so a steady cluster costs it no exec and no request; it execs
into the primary only to write the gate when the report shows the wrong one (a new primary, a restarted
container, a changed store) and to ask the store why archiving fails.

So that a steady, busy cluster does not patch its pod for every archived segment, the report is
published at once when its state changes (the gate, failing or not, anything archived yet, the failing
segment, the backlog's order of magnitude) and otherwise, when only the last archived segment or the
failure count moved, at most once per `REFRESH_SECONDS`.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pg_operator.backup.archive_health import ArchiverStats
from pg_operator.backup.catalog import parse_time

ARCHIVE_REPORT_ANNOTATION = "db.example.com/archiving"
POLL_SECONDS = 5.0
REFRESH_SECONDS = 60.0


def backlog_bucket(pending: int) -> int:
    """The backlog rounded down to a power of two, 0 below 4: a busy primary's 0 to 3 waiting segments do
    not count as a change, a growing backlog does, once per doubling."""
    if pending < 4:
        return 0
    return 1 << (pending.bit_length() - 1)


@dataclass(frozen=True)
class ArchiveReport:
    gate: str  # the gate file's line ("archive <token>", "discard <token>") or "" (no file)
    stats: ArchiverStats

    def state(self) -> tuple[object, ...]:
        """What, when it changes, is published at once."""
        s = self.stats
        return (self.gate, s.failing, s.archived_count == 0, s.last_failed_wal if s.failing else "",
                backlog_bucket(s.pending))  # fmt: skip

    def to_annotation(self) -> str:
        s = self.stats
        doc: dict[str, Any] = {
            "gate": self.gate,
            "archivedCount": s.archived_count,
            "lastArchivedWAL": s.last_archived_wal,
            "lastArchivedTime": _stamp(s.last_archived_time),
            "failedCount": s.failed_count,
            "lastFailedWAL": s.last_failed_wal,
            "lastFailedTime": _stamp(s.last_failed_time),
            "pendingWAL": backlog_bucket(s.pending),
        }
        return json.dumps({k: v for k, v in doc.items() if v not in ("", None)}, sort_keys=True,
                          separators=(",", ":"))  # fmt: skip


def should_publish(last: ArchiveReport | None, now: ArchiveReport, seconds_since_last: float) -> bool:
    if last is None or last.state() != now.state():
        return True
    moved = (last.stats.last_archived_wal, last.stats.failed_count) != (
        now.stats.last_archived_wal,
        now.stats.failed_count,
    )
    return moved and seconds_since_last >= REFRESH_SECONDS


def parse_report(annotations: Mapping[str, Any] | None) -> ArchiveReport | None:
    """The report on a pod, or None when it has none or it cannot be read (then the operator asks the
    pod itself, as for instances of an older image)."""
    raw = (annotations or {}).get(ARCHIVE_REPORT_ANNOTATION)
    if not isinstance(raw, str):
        return None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            return None
        stats = ArchiverStats(
            archived_count=int(doc.get("archivedCount", 0)),
            last_archived_wal=str(doc.get("lastArchivedWAL", "")),
            last_archived_time=_time(doc.get("lastArchivedTime")),
            failed_count=int(doc.get("failedCount", 0)),
            last_failed_wal=str(doc.get("lastFailedWAL", "")),
            last_failed_time=_time(doc.get("lastFailedTime")),
            pending=int(doc.get("pendingWAL", 0)),
        )
        return ArchiveReport(gate=str(doc.get("gate", "")), stats=stats)
    except (TypeError, ValueError):
        return None


def settled(stats: ArchiverStats, primary: str | None, previous: Mapping[str, Any] | None) -> ArchiverStats:
    """The figures to show in the cluster's status: while archiving's state is what the status already
    shows (same primary, still working or still failing on the same segment, the same backlog bucket), the
    status' own last-archived and last-failed figures stay, so a busy, healthy cluster writes no status
    for every segment. The live figures are the report itself and the instance's metrics."""
    prev = previous or {}
    if not prev or str(prev.get("primary") or "") != (primary or "") or not prev.get("lastArchivedWAL"):
        return stats
    failing_before = bool(prev.get("lastFailedWAL"))
    if stats.failing != failing_before or stats.archived_count == 0:
        return stats
    if stats.failing and prev.get("lastFailedWAL") != stats.last_failed_wal:
        return stats
    if backlog_bucket(stats.pending) != backlog_bucket(int(prev.get("pendingWAL") or 0)):
        return stats
    kept = replace(
        stats,
        last_archived_wal=str(prev["lastArchivedWAL"]),
        last_archived_time=_time(prev.get("lastArchivedTime")),
        pending=int(prev.get("pendingWAL") or 0),
    )
    if stats.failing:  # the time of the failure the status shows (not older than its last success)
        kept = replace(kept, last_failed_time=_time(prev.get("lastFailedTime")))
    else:  # a failure older than the last success shows nowhere
        kept = replace(kept, last_failed_wal="", last_failed_time=None)
    return kept if kept.failing == stats.failing else stats


def annotation_patch(report: ArchiveReport | None) -> dict[str, Any]:
    """A merge patch of the pod's metadata: the report, or its removal (a standby publishes none)."""
    value = None if report is None else report.to_annotation()
    return {"metadata": {"annotations": {ARCHIVE_REPORT_ANNOTATION: value}}}


def _stamp(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else ""


def _time(value: object) -> dt.datetime | None:
    return parse_time(value) if isinstance(value, str) and value else None
