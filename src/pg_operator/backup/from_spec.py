"""The backup package's values for a cluster's validated spec: its own store and archiving settings
(`spec.backup`), its recovery source and target (`spec.bootstrap.recovery`), its retention policy."""

from __future__ import annotations

from pg_operator.api.backup import (
    BackupConfiguration,
    Compression,
    RecoveryBootstrap,
    Retention,
    S3Destination,
)
from pg_operator.backup.archiving import ArchiveSettings
from pg_operator.backup.barman import DEFAULT_BIN_DIR, ObjectStore
from pg_operator.backup.recovery import RecoveryTarget
from pg_operator.backup.retention import RetentionPolicy


def object_store(
    s3: S3Destination, server_name: str, *, compression: Compression = "gzip", bin_dir: str = DEFAULT_BIN_DIR
) -> ObjectStore:
    return ObjectStore(
        bucket=s3.bucket,
        server_name=server_name,
        path=s3.path,
        endpoint_url=s3.endpoint_url,
        region=s3.region,
        compression=compression,
        bin_dir=bin_dir,
    )


def archive_settings(
    backup: BackupConfiguration, cluster_name: str, *, bin_dir: str = DEFAULT_BIN_DIR
) -> ArchiveSettings:
    """The cluster's own archive: its store under its own name (or, after an in-place major upgrade,
    its current generation's: backup.generations), with spec.backup's settings."""
    server = backup.generation_server_name or cluster_name
    return ArchiveSettings(
        store=object_store(backup.s3, server, compression=backup.compression, bin_dir=bin_dir),
        archive_timeout=backup.archive_timeout,
        wal_max_keep_size=backup.wal_max_keep_size,
    )


def recovery_source(recovery: RecoveryBootstrap, *, bin_dir: str = DEFAULT_BIN_DIR) -> ObjectStore:
    # Compression is detected when reading; the value here is unused. The server is the generation of
    # the source's backups the target lies in (backup.generations), by default the source's name.
    server = recovery.source.generation_server_name or recovery.source.cluster_name
    return object_store(recovery.source.s3, server, bin_dir=bin_dir)


def recovery_target(recovery: RecoveryBootstrap) -> RecoveryTarget:
    return RecoveryTarget(time=recovery.target_time, lsn=recovery.target_lsn, backup_id=recovery.backup_id)


def retention_policy(retention: Retention) -> RetentionPolicy:
    return RetentionPolicy(recovery_window=retention.recovery_window, keep_last=retention.keep_last)
