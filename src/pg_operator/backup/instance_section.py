"""The `backup` section of instance.yaml, which the operator renders from the cluster spec (`section`)
and the instance entrypoint reads (`backup.instance_hook.apply`). Plain mappings in camelCase, so the
image needs nothing beyond this package.

    backup:
      archive: {store: {...}, archiveTimeout: 60s, walMaxKeepSize: 10GB}     # this cluster's own archive
      recovery: {source: {...}, targetTime|targetLSN|backupID, sessionToken}  # only when restoring
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator.backup.archiving import ArchiveSettings
from pg_operator.backup.barman import DEFAULT_BIN_DIR, ObjectStore
from pg_operator.backup.recovery import RecoveryTarget, recovery_conflict


@dataclass(frozen=True)
class RecoveryPlan:
    source: ObjectStore  # server_name = the source cluster's name
    target: RecoveryTarget
    session_token: bool = False  # the source's Secret has a session token key

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source.to_mapping(), "sessionToken": self.session_token}
        for key, value in (("targetTime", self.target.time), ("targetLSN", self.target.lsn),
                           ("backupID", self.target.backup_id)):  # fmt: skip
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, bin_dir: str = DEFAULT_BIN_DIR) -> RecoveryPlan:
        source = data.get("source")
        if not isinstance(source, Mapping):
            raise ValueError("backup.recovery.source: required mapping")
        return cls(
            source=ObjectStore.from_mapping(source, bin_dir=bin_dir),
            target=RecoveryTarget(
                time=data.get("targetTime"), lsn=data.get("targetLSN"), backup_id=data.get("backupID")
            ),
            session_token=bool(data.get("sessionToken", False)),
        )


def section(archive: ArchiveSettings | None, recovery: RecoveryPlan | None) -> dict[str, Any] | None:
    """instance.yaml's `backup` value (None: no backups configured and no restore)."""
    if archive is None and recovery is None:
        return None
    if recovery is not None:
        conflict = recovery_conflict(recovery.source, archive.store if archive else None)
        if conflict:
            raise ValueError(conflict)
    out: dict[str, Any] = {}
    if archive is not None:
        out["archive"] = archive.to_mapping()
    if recovery is not None:
        out["recovery"] = recovery.to_mapping()
    return out
