"""The parts of a cluster's `.status` the backup reconcilers write (controller/backup_reconcilers): their
conditions and `status.backup`. compute_status carries them over from the previous status unchanged, so the
cluster's own reconcile (which writes the whole status) never drops them; the backup controller is the
only writer of their values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BACKUP_CONDITION_TYPES: tuple[str, ...] = ("ContinuousArchiving", "LastBackupSucceeded", "BackupStoreCleanup")
BACKUP_STATUS_KEY = "backup"


def carried_conditions(previous: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The backup controller's conditions of `previous`, in BACKUP_CONDITION_TYPES order."""
    found = {
        str(c.get("type")): dict(c)
        for c in (previous or {}).get("conditions") or ()
        if c.get("type") in BACKUP_CONDITION_TYPES
    }
    return [found[t] for t in BACKUP_CONDITION_TYPES if t in found]


def carried_fields(previous: Mapping[str, Any] | None) -> dict[str, Any]:
    value = (previous or {}).get(BACKUP_STATUS_KEY)
    return {BACKUP_STATUS_KEY: value} if value else {}
