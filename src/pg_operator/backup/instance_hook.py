"""The two ends of the `backup` section of instance.yaml: the operator renders it from the cluster spec
(`section`), the instance entrypoint lays it over the Patroni config it rendered (`apply`). Plain
mappings in camelCase, so the image needs nothing beyond this package.

    backup:
      archive: {store: {...}, archiveTimeout: 60s, walMaxKeepSize: 10GB}     # this cluster's own archive
      recovery: {source: {...}, targetTime|targetLSN|backupID, sessionToken}  # only when restoring
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pg_operator.backup.archive_gate import DEFAULT_GATE_DIR
from pg_operator.backup.archiving import ArchiveSettings, merge, patroni_fragment
from pg_operator.backup.barman import DEFAULT_BIN_DIR, ObjectStore
from pg_operator.backup.recovery import RecoveryTarget, patroni_bootstrap, recovery_conflict


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


def _run_dir(config: Mapping[str, Any]) -> str:
    parameters = (config.get("postgresql") or {}).get("parameters") or {}
    first = str(parameters.get("unix_socket_directories") or "").split(",")[0].strip()
    return first or DEFAULT_GATE_DIR


def apply(
    config: Mapping[str, Any],
    backup: Mapping[str, Any] | None,
    *,
    pgdata: str,
    bin_dir: str = DEFAULT_BIN_DIR,
) -> dict[str, Any]:
    """The Patroni config with archiving (parameters, replicas' restore_command) and, for a restore,
    the custom bootstrap method in place of initdb. Without a backup section: the config unchanged."""
    out = dict(config)
    if not backup:
        return out
    archive_data = backup.get("archive")
    archive = ArchiveSettings.from_mapping(archive_data, bin_dir=bin_dir) if archive_data else None
    if archive is not None:
        # archive_command waits behind the gate in the instance's run directory (its Unix socket
        # directory), which the operator opens once the cluster owns its store prefix.
        archive = replace(archive, gate_dir=_run_dir(out))
        out = merge(out, patroni_fragment(archive))
    recovery_data = backup.get("recovery")
    if recovery_data:
        plan = RecoveryPlan.from_mapping(recovery_data, bin_dir=bin_dir)
        bootstrap = {k: v for k, v in dict(out.get("bootstrap") or {}).items() if k != "initdb"}
        bootstrap.update(
            patroni_bootstrap(
                plan.source,
                plan.target,
                pgdata,
                archive.store if archive else None,
                session_token=plan.session_token,
            )
        )
        out["bootstrap"] = bootstrap
    return out
