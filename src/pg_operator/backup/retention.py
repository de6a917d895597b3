"""Which base backups a retention policy lets go.

Two policies, as barman knows them: a recovery window (`7d`, `4w`, `3m`: any point in the last 7 days,
4 weeks, 3 months must stay restorable) or a count (`keepLast: 5`). Whatever the policy, the newest
completed backup is never deleted, so a cluster always keeps one restore point.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import check_retention

_UNITS = {"d": ("DAYS", 1), "w": ("WEEKS", 7), "m": ("MONTHS", 31)}


@dataclass(frozen=True)
class RetentionPolicy:
    recovery_window: str | None = None  # e.g. "7d"
    keep_last: int | None = None

    def __post_init__(self) -> None:
        check_retention(self.recovery_window, self.keep_last)

    @property
    def window(self) -> dt.timedelta | None:
        """The recovery window as a duration; a month counts as 31 days (barman's rule is calendar
        months; 31 days keeps at least as much)."""
        if self.recovery_window is None:
            return None
        return dt.timedelta(days=int(self.recovery_window[:-1]) * _UNITS[self.recovery_window[-1]][1])

    def barman_policy(self) -> str:
        """The policy in barman's words, for `barman-cloud-backup-delete --retention-policy`."""
        if self.keep_last is not None:
            return f"REDUNDANCY {self.keep_last}"
        assert self.recovery_window is not None
        return f"RECOVERY WINDOW OF {int(self.recovery_window[:-1])} {_UNITS[self.recovery_window[-1]][0]}"


@dataclass(frozen=True)
class BackupRecord:
    backup_id: str
    end_time: dt.datetime | None  # None while running
    status: str  # barman's status: DONE, FAILED, STARTED, ...

    @property
    def completed(self) -> bool:
        return self.status == "DONE" and self.end_time is not None


def obsolete_backups(backups: Sequence[BackupRecord], policy: RetentionPolicy, now: dt.datetime) -> list[str]:
    """IDs of the backups the policy no longer needs, oldest first.

    keepLast N keeps the N newest completed backups. A recovery window keeps every completed backup that
    ended inside it plus the newest one that ended before it (the base the window's first minutes replay
    from). Failed backups older than the oldest kept one go too; running ones are never touched.
    """
    completed = sorted((b for b in backups if b.completed), key=lambda b: (b.end_time, b.backup_id))
    if not completed:
        return []
    if policy.keep_last is not None:
        keep_from = max(0, len(completed) - policy.keep_last)
    else:
        window = policy.window
        assert window is not None
        start = now - window
        before = [i for i, b in enumerate(completed) if b.end_time is not None and b.end_time < start]
        keep_from = before[-1] if before else 0
    # The newest completed backup stays, whatever the policy.
    keep_from = min(keep_from, len(completed) - 1)
    oldest_kept = completed[keep_from]
    assert oldest_kept.end_time is not None
    doomed = {b.backup_id for b in completed[:keep_from]}
    doomed |= {
        b.backup_id
        for b in backups
        if b.status == "FAILED" and b.end_time is not None and b.end_time < oldest_kept.end_time
    }
    ordered = sorted(
        (b for b in backups if b.backup_id in doomed),
        key=lambda b: (b.end_time or now, b.backup_id),
    )
    return [b.backup_id for b in ordered]


def next_change(
    backups: Sequence[BackupRecord], policy: RetentionPolicy, now: dt.datetime
) -> dt.datetime | None:
    """The first moment after `now` when `obsolete_backups` of the same catalog can answer differently,
    None when only a new backup (or another policy) can change it. keepLast counts backups, so time alone
    changes nothing. A recovery window's answer changes only when the window's start passes the end of
    a completed backup: a second after its end plus the window (the start must lie after the end)."""
    window = policy.window
    if window is None:
        return None
    step = dt.timedelta(seconds=1)
    moments = [b.end_time + window + step for b in backups if b.completed and b.end_time is not None]
    return min((m for m in moments if m > now), default=None)


def retired_backup_objects(
    backup_objects: Sequence[Mapping[str, Any]],
    remaining: Sequence[BackupRecord],
    *,
    cluster: str,
    server_name: str,
    destination_path: str,
) -> list[str]:
    """Names of the Completed Backup objects whose base backup retention has removed from the store.

    `remaining` is the store's catalog after this reconcile's deletions. A Backup object is retired when it
    names this cluster, was written to this very store (serverName and destinationPath: a Backup of an
    earlier store configuration says nothing about this one), its backupID is no longer in the store,
    and it ended before the oldest completed backup still there: retention removes the oldest first, so
    only such a backup can be one it removed (also one removed by a reconcile that stopped before it could
    retire the object). A Backup that completed after the listing was read is newer than all of it and
    stays. With nothing completed left in the store nothing is retired: an empty listing says more
    about the store than about retention.
    """
    kept = [b for b in remaining if b.completed]
    if not kept:
        return []
    # Whole seconds: a Backup's stoppedAt has no fraction, barman's times may.
    oldest_end = min(b.end_time for b in kept if b.end_time is not None).replace(microsecond=0)
    present = {b.backup_id for b in remaining}
    out: list[str] = []
    for obj in backup_objects:
        spec, status, name = objects.spec(obj), objects.status(obj), objects.name(obj)
        if not name or spec.get("cluster") != cluster or status.get("phase") != "Completed":
            continue
        if status.get("serverName") != server_name or status.get("destinationPath") != destination_path:
            continue
        backup_id = str(status.get("backupID") or "")
        stopped = _parse_stamp(status.get("stoppedAt"))
        if not backup_id or backup_id in present or stopped is None or stopped >= oldest_end:
            continue
        out.append(name)
    return sorted(out)


def _parse_stamp(value: Any) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
