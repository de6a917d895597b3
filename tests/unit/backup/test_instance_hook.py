"""The instance.yaml `backup` section: rendered from the spec by the operator, laid over Patroni's config
by the instance entrypoint."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml

from pg_operator.api.backup import BackupConfiguration, RecoveryBootstrap
from pg_operator.backup.archive_gate import gated_archive_command
from pg_operator.backup.from_spec import archive_settings
from pg_operator.backup.instance_hook import apply
from pg_operator.specs.backup_pod import instance_backup_section

S3: dict[str, Any] = {"bucket": "backups", "path": "prod", "endpointURL": "http://minio:9000",
                      "credentials": {"secretName": "s3"}}  # fmt: skip
PATRONI: dict[str, Any] = {
    "scope": "orders-restored",
    "bootstrap": {"dcs": {"ttl": 20}, "initdb": ["data-checksums"], "post_bootstrap": "/bin/pb"},
    "postgresql": {"data_dir": "/pgdata", "parameters": {"hot_standby": "on"}},
}


def test_no_section_no_change() -> None:
    assert instance_backup_section("a", None, None) is None
    assert apply(PATRONI, None, pgdata="/pgdata") == PATRONI


def test_archiving_only() -> None:
    backup = BackupConfiguration.model_validate({"s3": S3, "walMaxKeepSize": "5GB"})
    section = instance_backup_section("orders-db", backup, None, bin_dir="/opt/b")
    assert section is not None
    # It survives YAML (the ConfigMap) unchanged.
    section = yaml.safe_load(yaml.safe_dump(section))
    config = apply(PATRONI, section, pgdata="/pgdata", bin_dir="/opt/b")
    params = config["postgresql"]["parameters"]
    assert params["hot_standby"] == "on" and params["archive_mode"] == "on"
    assert params["max_slot_wal_keep_size"] == "5GB"
    # archive_command waits behind the gate in the run directory (the default: no socket directory set).
    assert params["archive_command"] == gated_archive_command(
        archive_settings(backup, "orders-db", bin_dir="/opt/b").store, "/var/run/postgresql"
    )
    sockets = {**PATRONI, "postgresql": {"parameters": {"unix_socket_directories": "/run/pg, /tmp"}}}
    gated = apply(sockets, section, pgdata="/pgdata", bin_dir="/opt/b")["postgresql"]["parameters"]
    assert "cat /run/pg/pgop-archive-gate 2>/dev/null" in gated["archive_command"]
    assert "orders-db %f %p" in config["postgresql"]["recovery_conf"]["restore_command"]
    assert config["bootstrap"] == PATRONI["bootstrap"]


def test_restore_replaces_initdb_and_archives_under_its_own_name() -> None:
    backup = BackupConfiguration.model_validate({"s3": S3})
    recovery = RecoveryBootstrap.model_validate(
        {
            "source": {
                "clusterName": "orders-db",
                "s3": {**S3, "credentials": {"secretName": "old", "sessionTokenKey": "TOKEN"}},
            },
            "targetTime": "2026-12-01T08:00:00Z",
        }
    )
    section = yaml.safe_load(yaml.safe_dump(instance_backup_section("orders-restored", backup, recovery)))
    config = apply(PATRONI, section, pgdata="/pgdata")
    bootstrap = config["bootstrap"]
    assert "initdb" not in bootstrap and bootstrap["post_bootstrap"] == "/bin/pb" and bootstrap["dcs"]
    method = bootstrap[bootstrap["method"]]
    script = shlex.split(method["command"])[2]
    assert "s3://backups/prod orders-restored" in script.split(" && ")[0]  # checks its own path first
    assert 'AWS_SESSION_TOKEN="$PGOP_SOURCE_AWS_SESSION_TOKEN"' in script
    assert "orders-db auto /pgdata" in script
    assert method["recovery_conf"]["recovery_target_time"] == "2026-12-01 08:00:00.000000+00"
    assert "orders-restored %p" in config["postgresql"]["parameters"]["archive_command"]


def test_a_restore_into_its_source_is_refused() -> None:
    backup = BackupConfiguration.model_validate({"s3": S3})
    recovery = RecoveryBootstrap.model_validate({"source": {"clusterName": "orders-db", "s3": S3}})
    with pytest.raises(ValueError, match="archive into the source"):
        instance_backup_section("orders-db", backup, recovery)
