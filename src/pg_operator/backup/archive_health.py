"""The ContinuousArchiving condition, from the primary's pg_stat_archiver and its archive backlog (pure).

PostgreSQL keeps every WAL segment until archive_command succeeds for it (a `.ready` file per segment in
pg_wal/archive_status), so a failing archive makes WAL pile up on the primary's volume whatever
max_slot_wal_keep_size says. The condition says so, with the count, and the store's own reason when a
probe of the store (barman-cloud-backup-list) failed too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.backup.catalog import parse_time
from pg_operator.backup.failures import Failure
from pg_operator.backup.lifecycle import reason_of

# One psql line: pg_stat_archiver's counts, WALs and times, '|'-separated, then the number of segments
# waiting.
ARCHIVER_QUERY = (
    "SELECT archived_count, coalesce(last_archived_wal, ''), "
    "coalesce(to_char(last_archived_time AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), ''), "
    "failed_count, coalesce(last_failed_wal, ''), "
    "coalesce(to_char(last_failed_time AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), ''), "
    "(SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready') "
    "FROM pg_stat_archiver"
)


@dataclass(frozen=True)
class ArchiverStats:
    archived_count: int
    last_archived_wal: str
    last_archived_time: dt.datetime | None
    failed_count: int
    last_failed_wal: str
    last_failed_time: dt.datetime | None
    pending: int  # segments waiting to be archived

    @property
    def failing(self) -> bool:
        """The last attempt failed: a failure newer than the last success."""
        if self.last_failed_time is None:
            return False
        return self.last_archived_time is None or self.last_failed_time >= self.last_archived_time


def parse_archiver_line(line: str) -> ArchiverStats:
    parts = line.strip().split("|")
    if len(parts) != 7:
        raise ValueError(f"pg_stat_archiver: expected 7 fields, got {line.strip()!r}")
    return ArchiverStats(
        archived_count=int(parts[0]),
        last_archived_wal=parts[1],
        last_archived_time=parse_time(parts[2]) if parts[2] else None,
        failed_count=int(parts[3]),
        last_failed_wal=parts[4],
        last_failed_time=parse_time(parts[5]) if parts[5] else None,
        pending=int(parts[6]),
    )


def _stamp(value: dt.datetime | None) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else ""


@dataclass(frozen=True)
class ArchivingCondition:
    status: str  # "True", "False", "Unknown"
    reason: str
    message: str

    def as_tuple(self) -> tuple[str, str, str]:
        return self.status, self.reason, self.message


def archiving_condition(
    stats: ArchiverStats | None, *, store_failure: Failure | None = None, primary: str | None = None
) -> ArchivingCondition:
    if stats is None:
        if store_failure is not None:
            return ArchivingCondition("False", store_failure.reason, store_failure.message)
        if primary:
            return ArchivingCondition(
                "Unknown", "ArchiverUnreadable", f"pg_stat_archiver could not be read on {primary}"
            )
        return ArchivingCondition("Unknown", "NoPrimary", "no ready primary to read pg_stat_archiver from")
    where = f" on {primary}" if primary else ""
    if stats.failing:
        reason = store_failure.reason if store_failure is not None else "ArchiveCommandFailing"
        detail = f": {store_failure.message}" if store_failure is not None else ""
        return ArchivingCondition(
            "False",
            reason,
            f"WAL archiving fails{where} (last failed: {stats.last_failed_wal} at "
            f"{_stamp(stats.last_failed_time)}, {stats.failed_count} failures); WAL is piling up: "
            f"{stats.pending} segment(s) wait to be archived{detail}",
        )
    if stats.archived_count == 0 and stats.last_archived_time is None:
        if store_failure is not None:  # nothing tried yet, but the store already refuses
            return ArchivingCondition("False", store_failure.reason, f"no WAL segment archived yet{where}: "
                                      f"{store_failure.message}")  # fmt: skip
        return ArchivingCondition("False", "NothingArchivedYet", f"no WAL segment archived yet{where}")
    backlog = f"; {stats.pending} or more segments waiting" if stats.pending else ""
    return ArchivingCondition("True", "Archiving", f"WAL archiving works{where}{backlog}")


def archiving_summary(stats: ArchiverStats | None, primary: str | None) -> dict[str, Any]:
    """status.backup.archiving: the figures behind the condition (stable between reconciles that see the same
    numbers, so no write when nothing moved)."""
    if stats is None:
        return {}
    out: dict[str, Any] = {
        "primary": primary or "",
        "lastArchivedWAL": stats.last_archived_wal,
        "lastArchivedTime": _stamp(stats.last_archived_time),
        "pendingWAL": stats.pending,
    }
    if stats.failing:
        out["lastFailedWAL"] = stats.last_failed_wal
        out["lastFailedTime"] = _stamp(stats.last_failed_time)
    return {k: v for k, v in out.items() if v != ""}


def last_backup_condition(backups: Sequence[Mapping[str, Any]]) -> tuple[str, str, str] | None:
    """LastBackupSucceeded from the cluster's Backups: the most recently finished one decides."""
    finished = [b for b in backups if objects.status(b).get("phase") in ("Completed", "Failed")]
    if not finished:
        return None

    def key(b: Mapping[str, Any]) -> tuple[str, str]:
        return (str(objects.status(b).get("stoppedAt") or ""), objects.name(b))

    latest = max(finished, key=key)
    name, status = objects.name(latest), objects.status(latest)
    if status.get("phase") == "Completed":
        stopped, backup_id = status.get("stoppedAt"), status.get("backupID")
        return ("True", "BackupCompleted", f"Backup {name} completed at {stopped} (backup ID {backup_id})")

    return ("False", reason_of(status.get("error")), f"Backup {name} failed: {status.get('error')}")
