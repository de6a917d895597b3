"""barman-cloud's JSON (backup-list / backup-show `--format json`) as the values the operator reports.

barman prints times like "Tue Dec  1 08:05:43 2026" in the local zone of the process; the pods and the
operator run in UTC, so they are read as UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from pg_operator.backup.retention import BackupRecord


def parse_time(value: Any) -> dt.datetime | None:
    if not value:
        return None
    text = str(value)
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        try:
            parsed = dt.datetime.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")
        except ValueError:
            raise ValueError(f"barman time {text!r} is neither ISO 8601 nor ctime") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def records(backup_list: Mapping[str, Any]) -> list[BackupRecord]:
    """BackupRecords from `barman-cloud-backup-list --format json`, oldest first."""
    entries = backup_list.get("backups_list")
    if not isinstance(entries, list):
        raise ValueError("barman-cloud-backup-list: no backups_list in its output")
    out = [
        BackupRecord(
            backup_id=str(b["backup_id"]), end_time=parse_time(b.get("end_time")), status=str(b["status"])
        )
        for b in entries
    ]
    return sorted(out, key=lambda r: r.backup_id)


def _rfc3339(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if value else None


def backup_status(show: Mapping[str, Any]) -> dict[str, Any]:
    """Backup `.status` fields from `barman-cloud-backup-show --format json` (one backup, under the key
    "cloud")."""
    info = show.get("cloud")
    if not isinstance(info, Mapping):
        raise ValueError("barman-cloud-backup-show: no 'cloud' entry in its output")
    status: dict[str, Any] = {
        "backupID": str(info["backup_id"]),
        "beginWal": info.get("begin_wal") or "",
        "endWal": info.get("end_wal") or "",
        "beginLSN": info.get("begin_xlog") or "",
        "endLSN": info.get("end_xlog") or "",
        "startedAt": _rfc3339(parse_time(info.get("begin_time"))),
        "stoppedAt": _rfc3339(parse_time(info.get("end_time"))),
        "size": int(info.get("cluster_size") or info.get("size") or 0),
        "timeline": int(info.get("timeline") or 0),
    }
    if info.get("status") == "DONE":
        status["phase"] = "Completed"
    elif info.get("status") == "FAILED":
        status["phase"] = "Failed"
        status["error"] = str(info.get("error") or "barman reported the backup as failed")
    else:
        status["phase"] = "Running"
    return {k: v for k, v in status.items() if v is not None}
