"""The backup API models and their CRDs: validation naming the field, defaults; the backup package's values
built from them; the pod's barman-cloud environment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from pg_operator.api.backup import (
    BACKUP,
    ROOT_BACKUP_RULES,
    SCHEDULED_BACKUP,
    BackupConfiguration,
    BackupSpec,
    RecoveryBootstrap,
    ScheduledBackupSpec,
    recovery_conflict,
)
from pg_operator.api.crd import build
from pg_operator.backup.barman import archive_command
from pg_operator.backup.from_spec import archive_settings, recovery_source, recovery_target, retention_policy
from pg_operator.specs.backup_pod import pod_env

REPO = Path(__file__).resolve().parents[3]
S3: dict[str, Any] = {"bucket": "backups", "path": "prod", "endpointURL": "http://minio:9000",
                      "credentials": {"secretName": "s3-creds"}}  # fmt: skip


def errors(model: Any, data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return str(info.value)


def test_backup_configuration_defaults_and_settings() -> None:
    cfg = BackupConfiguration.model_validate({"s3": S3})
    assert (cfg.compression, cfg.on_delete, cfg.wal_max_keep_size, cfg.archive_timeout) == (
        "gzip",
        "keep",
        "10GB",
        "60s",
    )
    assert cfg.retention is None
    assert cfg.s3.credentials.access_key_id_key == "ACCESS_KEY_ID"
    settings = archive_settings(cfg, "orders-db", bin_dir="/opt/b")
    assert settings.store.destination_url == "s3://backups/prod" and settings.store.server_name == "orders-db"
    assert "http://minio:9000" in archive_command(settings.store)


@pytest.mark.parametrize("compression", ["gzip", "bzip2", "lz4", "snappy", "none"])
def test_every_barman_cloud_compression_is_accepted(compression: str) -> None:
    cfg = BackupConfiguration.model_validate({"s3": S3, "compression": compression})
    assert archive_settings(cfg, "orders-db", bin_dir="/opt/b").store.compression == compression


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"retention": {"recoveryWindow": "7d", "keepLast": 2}}, "exactly one"),
        ({"retention": {}}, "exactly one"),
        ({"retention": {"recoveryWindow": "7x"}}, "retention.recoveryWindow"),
        ({"retention": {"keepLast": 0}}, "retention.keepLast"),
        ({"compression": "xz"}, "compression"),
        ({"compression": "zstd"}, "compression"),
        ({"onDelete": "purge"}, "onDelete"),
        ({"walMaxKeepSize": "10G"}, "walMaxKeepSize"),
        ({"s3": {**S3, "bucket": "Bad_Bucket"}}, "s3.bucket"),
        ({"s3": {**S3, "endpointURL": "minio:9000"}}, "s3.endpointURL"),
        ({"s3": {**S3, "credentials": {}}}, "s3.credentials.secretName"),
        ({"s3": {**S3, "extra": 1}}, "s3.extra"),
    ],
)
def test_bad_backup_configuration(change: dict[str, Any], field: str) -> None:
    assert field in errors(BackupConfiguration, {"s3": S3, **change})


def test_retention_policy() -> None:
    cfg = BackupConfiguration.model_validate({"s3": S3, "retention": {"recoveryWindow": "4w"}})
    assert cfg.retention is not None
    assert retention_policy(cfg.retention).barman_policy() == "RECOVERY WINDOW OF 4 WEEKS"


def test_recovery_bootstrap() -> None:
    source = {"clusterName": "orders-db", "s3": S3}
    rec = RecoveryBootstrap.model_validate({"source": source, "targetTime": "2026-12-01T08:00:00Z"})
    assert recovery_target(rec).postgres_time == "2026-12-01 08:00:00.000000+00"
    assert recovery_source(rec).server_name == "orders-db"
    assert "at most one" in errors(
        RecoveryBootstrap, {"source": source, "targetTime": "2026-12-01T08:00:00Z", "targetLSN": "0/1"}
    )
    assert "targetTime" in errors(RecoveryBootstrap, {"source": source, "targetTime": "2026-12-01 08:00"})
    assert "targetTime" in errors(RecoveryBootstrap, {"source": source, "targetTime": "2026-13-01T08:00:00Z"})
    assert "targetLSN" in errors(RecoveryBootstrap, {"source": source, "targetLSN": "xyz"})
    assert "backupID" in errors(RecoveryBootstrap, {"source": source, "backupID": "latest"})


def test_recovery_conflict() -> None:
    rec = RecoveryBootstrap.model_validate({"source": {"clusterName": "orders-db", "s3": S3}})
    own = BackupConfiguration.model_validate({"s3": S3})
    assert recovery_conflict("orders-db", own, rec) is not None
    assert recovery_conflict("orders-restored", own, rec) is None
    other_path = BackupConfiguration.model_validate({"s3": {**S3, "path": "restored"}})
    assert recovery_conflict("orders-db", other_path, rec) is None
    assert recovery_conflict("orders-db", None, rec) is None


def test_backup_and_scheduled_backup_specs() -> None:
    assert BackupSpec.model_validate({"cluster": "orders-db"}).cluster == "orders-db"
    assert "cluster" in errors(BackupSpec, {"cluster": "Orders"})
    sched = ScheduledBackupSpec.model_validate({"cluster": "a", "schedule": "0 3 * * *"})
    assert not sched.suspend and not sched.immediate
    assert "runs backwards" in errors(ScheduledBackupSpec, {"cluster": "a", "schedule": "5-1 * * * *"})


def test_pod_env() -> None:
    own = BackupConfiguration.model_validate({"s3": {**S3, "region": "eu-west-1"}})
    rec = RecoveryBootstrap.model_validate(
        {"source": {"clusterName": "old", "s3": {**S3, "credentials": {"secretName": "old-creds"}}}}
    )
    env = {e["name"]: e for e in pod_env(own, rec)}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "s3-creds",
        "key": "ACCESS_SECRET_KEY",
    }
    assert env["PGOP_SOURCE_AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "old-creds"
    assert env["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
    assert all("value" not in e or "KEY" not in e["name"] for e in env.values())
    assert pod_env(None) == []
    only_source = {e["name"] for e in pod_env(None, rec)}
    assert "AWS_REQUEST_CHECKSUM_CALCULATION" in only_source and "AWS_ACCESS_KEY_ID" not in only_source


def test_crds() -> None:
    for crd, kind in ((build(BACKUP), "Backup"), (build(SCHEDULED_BACKUP), "ScheduledBackup")):
        version = crd["spec"]["versions"][0]
        assert crd["spec"]["names"]["kind"] == kind and version["subresources"] == {"status": {}}
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["required"] == ["spec"]
        assert "default" not in str(schema["properties"]["status"])
    sched = build(SCHEDULED_BACKUP)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert sched["properties"]["suspend"]["default"] is False
    assert len(sched["properties"]["schedule"]["x-kubernetes-validations"]) == 2
    assert "self.metadata.name" in ROOT_BACKUP_RULES[0]["rule"]
    backup_schema = build(BACKUP)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    backup_root = backup_schema["x-kubernetes-validations"]
    assert "'latest'" in backup_root[0]["rule"] and "[0-9]{8}T[0-9]{6}" in backup_root[0]["rule"]


def test_catalog_status_keys_are_backup_status_fields() -> None:
    from pg_operator.api.backup import BackupStatus
    from pg_operator.backup.catalog import backup_status

    shown = {"cloud": {"backup_id": "20261201T080543", "begin_wal": "000000010000000000000002",
                       "end_wal": "000000010000000000000002", "begin_xlog": "0/2000028",
                       "end_xlog": "0/2000100",
                       "begin_time": "Tue Dec  1 08:05:43 2026", "end_time": "Tue Dec  1 08:05:46 2026",
                       "cluster_size": 1, "status": "FAILED", "error": "x", "timeline": 1}}  # fmt: skip
    status = backup_status(shown)
    aliases = {f.alias or name for name, f in BackupStatus.model_fields.items()}
    assert set(status) <= aliases, set(status) - aliases
    parsed = BackupStatus.model_validate(status)
    assert (
        parsed.backup_id == "20261201T080543" and parsed.begin_lsn == "0/2000028" and parsed.phase == "Failed"
    )
