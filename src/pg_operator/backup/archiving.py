"""PostgreSQL settings for continuous WAL archiving, as a fragment of Patroni's configuration.

archive_mode=on archives on the primary only (a replica that is promoted starts archiving then);
archive_timeout bounds the data at risk when writes are rare (RPO ≈ archive_timeout); every replica has a
restore_command, so one that fell behind the primary's WAL retention catches up from the archive instead
of needing a new base backup. max_slot_wal_keep_size bounds the WAL a replication slot can pin (a
replica gone for good must not fill the primary's disk). It does not bound WAL that is waiting to be
archived: PostgreSQL keeps a segment until archive_command succeeds, by design. That backlog shows in
pg_stat_archiver (failed_count, last_failed_wal/time) and must be alerted on (see docs/backups.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator.api.backup import (
    ARCHIVE_TIMEOUT_PATTERN,
    DEFAULT_ARCHIVE_TIMEOUT,
    DEFAULT_WAL_MAX_KEEP_SIZE,
    WAL_SIZE_PATTERN,
)
from pg_operator.backup.archive_gate import gated_archive_command
from pg_operator.backup.barman import ObjectStore, archive_command, restore_command

# The settings this fragment owns (on top of those Patroni owns); user values for them are refused.
ARCHIVING_PARAMETERS: tuple[str, ...] = (
    "archive_mode",
    "archive_timeout",
    "archive_command",
    "restore_command",
    "max_slot_wal_keep_size",
)


@dataclass(frozen=True)
class ArchiveSettings:
    store: ObjectStore  # this cluster's own place: server_name = the cluster's name
    archive_timeout: str = DEFAULT_ARCHIVE_TIMEOUT
    wal_max_keep_size: str = DEFAULT_WAL_MAX_KEEP_SIZE
    # Where the instance finds the gate the operator opens once the cluster owns its store prefix
    # (backup.archive_gate); None: archive_command ungated (tests of barman alone). Not in instance.yaml:
    # the entrypoint sets it to its run directory.
    gate_dir: str | None = None

    def __post_init__(self) -> None:
        if not re.match(ARCHIVE_TIMEOUT_PATTERN, self.archive_timeout):
            raise ValueError(f"backup.archiveTimeout: {self.archive_timeout!r} must be like 60s or 5min")
        if not re.match(WAL_SIZE_PATTERN, self.wal_max_keep_size):
            raise ValueError(f"backup.walMaxKeepSize: {self.wal_max_keep_size!r} must be like 512MB or 10GB")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **store_kwargs: Any) -> ArchiveSettings:
        """From the camelCase mapping (instance.yaml's `backup` section): {store: {...}, archiveTimeout,
        walMaxKeepSize}."""
        store = data.get("store")
        if not isinstance(store, Mapping):
            raise ValueError("backup.store: required mapping")
        return cls(
            store=ObjectStore.from_mapping(store, **store_kwargs),
            archive_timeout=str(data.get("archiveTimeout", DEFAULT_ARCHIVE_TIMEOUT)),
            wal_max_keep_size=str(data.get("walMaxKeepSize", DEFAULT_WAL_MAX_KEEP_SIZE)),
        )

    def to_mapping(self) -> dict[str, Any]:
        return {
            "store": self.store.to_mapping(),
            "archiveTimeout": self.archive_timeout,
            "walMaxKeepSize": self.wal_max_keep_size,
        }


def archiving_parameters(settings: ArchiveSettings) -> dict[str, str]:
    """postgresql.conf settings for archiving (the primary archives; replicas ignore archive_command)."""
    return {
        "archive_mode": "on",
        "archive_timeout": settings.archive_timeout,
        "archive_command": (
            gated_archive_command(settings.store, settings.gate_dir)
            if settings.gate_dir is not None
            else archive_command(settings.store)
        ),
        "max_slot_wal_keep_size": settings.wal_max_keep_size,
    }


def replica_recovery_conf(settings: ArchiveSettings) -> dict[str, str]:
    """Patroni's `postgresql.recovery_conf` for replicas: fetch WAL from the archive when streaming
    cannot provide it."""
    return {"restore_command": restore_command(settings.store)}


def patroni_fragment(settings: ArchiveSettings) -> dict[str, Any]:
    """The part of Patroni's YAML that archiving adds, to deep-merge into the rendered config:
    `postgresql.parameters` and `postgresql.recovery_conf`."""
    return {
        "postgresql": {
            "parameters": archiving_parameters(settings),
            "recovery_conf": replica_recovery_conf(settings),
        }
    }


def merge(base: Mapping[str, Any], fragment: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge (fragment wins on scalars), for laying a fragment over a rendered Patroni config."""
    out = dict(base)
    for key, value in fragment.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
