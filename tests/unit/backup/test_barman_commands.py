"""barman-cloud command lines, archiving settings, recovery bootstrap, failure reasons, catalog parsing."""

from __future__ import annotations

import datetime as dt
import shlex

import pytest

from pg_operator.api.backup import COMPRESSIONS
from pg_operator.backup import barman, catalog
from pg_operator.backup.archiving import ArchiveSettings, archiving_parameters, merge, patroni_fragment
from pg_operator.backup.failures import classify
from pg_operator.backup.recovery import (
    RecoveryTarget,
    bootstrap_command,
    patroni_bootstrap,
    recovery_conflict,
    recovery_settings,
)
from pg_operator.specs.backup_pod import barman_env

STORE = barman.ObjectStore(
    bucket="backups",
    server_name="orders-db",
    path="prod/",
    endpoint_url="http://minio:9000",
    bin_dir="/opt/b",
)
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_destination_and_prefix() -> None:
    assert STORE.destination_url == "s3://backups/prod"
    assert STORE.prefix == "prod/orders-db/"
    bare = barman.ObjectStore(bucket="backups", server_name="a")
    assert bare.destination_url == "s3://backups" and bare.prefix == "a/"


def test_archive_and_restore_commands() -> None:
    assert barman.wal_archive_argv(STORE) == [
        "/opt/b/barman-cloud-wal-archive", "--cloud-provider", "aws-s3", "--endpoint-url", "http://minio:9000",
        "--gzip", "s3://backups/prod", "orders-db", "%p",
    ]  # fmt: skip
    assert barman.archive_command(STORE).endswith(" s3://backups/prod orders-db %p")
    assert barman.restore_command(STORE).endswith(" s3://backups/prod orders-db %f %p")
    none = barman.ObjectStore(bucket="backups", server_name="a", compression="none")
    assert "--gzip" not in barman.wal_archive_argv(none) and "--endpoint-url" not in barman.wal_archive_argv(
        none
    )
    snappy = barman.ObjectStore(bucket="backups", server_name="a", compression="snappy")
    assert "--snappy" in barman.wal_archive_argv(snappy)


# barman-cloud 3.19's own option for each compression; "none" passes none.
FLAGS = {"gzip": "--gzip", "bzip2": "--bzip2", "lz4": "--lz4", "snappy": "--snappy", "none": None}


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_each_compression_reaches_archive_and_backup_but_not_the_reads(compression: str) -> None:
    store = barman.ObjectStore(bucket="backups", server_name="a", compression=compression)  # type: ignore[arg-type]
    flags = set(FLAGS.values()) - {None}
    archive = barman.wal_archive_argv(store)
    backup = barman.base_backup_argv(store, name="b", host="h", port=1, user="u")
    expected = {FLAGS[compression]} - {None}
    assert flags & set(archive) == expected and flags & set(backup) == expected
    # Restores detect the compression from what they read: the same command for every codec.
    assert flags.isdisjoint(barman.wal_restore_argv(store))
    assert flags.isdisjoint(barman.restore_argv(store, "/d"))


def test_every_offered_compression_has_a_flag() -> None:
    assert set(COMPRESSIONS) == set(FLAGS)


def test_base_backup_command() -> None:
    argv = barman.base_backup_argv(
        STORE, name="nightly-1", host="/var/run/postgresql", port=5432, user="postgres"
    )
    assert argv[0] == "/opt/b/barman-cloud-backup"
    assert argv[-2:] == ["s3://backups/prod", "orders-db"]
    assert argv[argv.index("--name") + 1] == "nightly-1"
    assert "--immediate-checkpoint" in argv and "--gzip" in argv
    assert argv[argv.index("--jobs") + 1] == str(barman.BASE_BACKUP_JOBS)
    one_job = barman.base_backup_argv(STORE, name="b", host="h", port=1, user="u", jobs=1)
    assert one_job[one_job.index("--jobs") + 1] == "1"
    with pytest.raises(ValueError, match="jobs"):
        barman.base_backup_argv(STORE, name="b", host="h", port=1, user="u", jobs=0)
    for reserved in ("latest", "first", "auto", "20261201T030000"):
        with pytest.raises(ValueError, match="reserved"):
            barman.base_backup_argv(STORE, name=reserved, host="h", port=1, user="u")


def test_no_credentials_in_any_argv() -> None:
    argvs = [
        barman.wal_archive_argv(STORE), barman.wal_restore_argv(STORE), barman.backup_list_argv(STORE),
        barman.base_backup_argv(STORE, name="b", host="h", port=1, user="postgres"),
        barman.delete_backup_argv(STORE, "20261201T030000"),
        barman.restore_argv(STORE, "/data"), barman.check_wal_archive_argv(STORE),
    ]  # fmt: skip
    for argv in argvs:
        joined = " ".join(argv)
        assert "AWS_" not in joined and "secret" not in joined.lower()
    env = barman.credentials_env("AKIA", SECRET)
    assert env == {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": SECRET}
    assert barman.client_env(STORE)["AWS_REQUEST_CHECKSUM_CALCULATION"] == "when_required"


def test_restore_picks_the_backup() -> None:
    assert barman.restore_argv(STORE, "/d")[-2:] == ["latest", "/d"]
    timed = barman.restore_argv(STORE, "/d", target_time="2026-12-01 08:00:00.000000+00")
    assert timed[-2:] == ["auto", "/d"] and "--target-time" in timed
    chosen = barman.restore_argv(STORE, "/d", backup_id="20261201T030000", target_lsn="0/3000000")
    assert chosen[-2] == "20261201T030000" and "--target-lsn" not in chosen


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bucket": "Bad_Bucket"}, "backup.s3.bucket"),
        ({"bucket": "ab"}, "backup.s3.bucket"),
        ({"path": "a b"}, "backup.s3.path"),
        ({"endpoint_url": "minio:9000"}, "backup.s3.endpointURL"),
        ({"compression": "xz"}, "backup.compression"),
        # WAL would take zstd, base backups would not: one field serves both.
        ({"compression": "zstd"}, "backup.compression"),
        ({"server_name": "Orders"}, "server name"),
    ],
)
def test_bad_stores(kwargs: dict[str, str], field: str) -> None:
    values = {"bucket": "backups", "server_name": "a", **kwargs}
    with pytest.raises(ValueError, match=field):
        barman.ObjectStore(**values)  # type: ignore[arg-type]


def test_store_mapping_round_trip() -> None:
    assert barman.ObjectStore.from_mapping(STORE.to_mapping(), bin_dir="/opt/b") == STORE


def test_archiving_parameters() -> None:
    params = archiving_parameters(ArchiveSettings(STORE, archive_timeout="5min", wal_max_keep_size="2GB"))
    assert params == {
        "archive_mode": "on",
        "archive_timeout": "5min",
        "archive_command": barman.archive_command(STORE),
        "max_slot_wal_keep_size": "2GB",
    }
    with pytest.raises(ValueError, match=r"backup\.walMaxKeepSize"):
        ArchiveSettings(STORE, wal_max_keep_size="2G")
    with pytest.raises(ValueError, match=r"backup\.archiveTimeout"):
        ArchiveSettings(STORE, archive_timeout="0s")
    settings = ArchiveSettings(STORE)
    assert ArchiveSettings.from_mapping(settings.to_mapping(), bin_dir="/opt/b") == settings


def test_patroni_fragment_merges_into_a_config() -> None:
    base = {"postgresql": {"parameters": {"wal_log_hints": "on"}, "data_dir": "/d"}, "scope": "x"}
    merged = merge(base, patroni_fragment(ArchiveSettings(STORE)))
    assert merged["postgresql"]["parameters"]["wal_log_hints"] == "on"
    assert merged["postgresql"]["parameters"]["archive_mode"] == "on"
    assert merged["postgresql"]["recovery_conf"] == {"restore_command": barman.restore_command(STORE)}
    assert merged["postgresql"]["data_dir"] == "/d" and base["postgresql"]["parameters"] == {
        "wal_log_hints": "on"
    }


class TestRecovery:
    own = STORE.with_server("orders-restored")

    def test_settings_for_a_time(self) -> None:
        target = RecoveryTarget(time="2026-12-01T09:30:00.5+01:00")
        settings = recovery_settings(STORE, target)
        assert settings["recovery_target_time"] == "2026-12-01 08:30:00.500000+00"
        assert settings["recovery_target_action"] == "promote"
        assert settings["recovery_target_timeline"] == "latest"
        # The source's credentials, mapped in by the shell by name only.
        assert settings["restore_command"].startswith(
            'AWS_ACCESS_KEY_ID="$PGOP_SOURCE_AWS_ACCESS_KEY_ID" '
            'AWS_SECRET_ACCESS_KEY="$PGOP_SOURCE_AWS_SECRET_ACCESS_KEY"'
        )
        assert settings["restore_command"].endswith(barman.restore_command(STORE))

    def test_settings_for_an_lsn_and_for_latest(self) -> None:
        assert recovery_settings(STORE, RecoveryTarget(lsn="0/3000060"))["recovery_target_lsn"] == "0/3000060"
        latest = recovery_settings(STORE, RecoveryTarget())
        assert "recovery_target_action" not in latest and "recovery_target_time" not in latest

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"time": "2026-12-01T08:00:00"}, "recovery.targetTime"),
            ({"time": "2026-02-30T08:00:00Z"}, "not a real date"),
            ({"lsn": "3000060"}, "recovery.targetLSN"),
            ({"time": "2026-12-01T08:00:00Z", "lsn": "0/1"}, "at most one"),
            ({"backup_id": "latest"}, "recovery.backupID"),
        ],
    )
    def test_bad_targets(self, kwargs: dict[str, str], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            RecoveryTarget(**kwargs)

    def test_bootstrap_checks_its_own_path_then_restores(self) -> None:
        target = RecoveryTarget(time="2026-12-01T08:00:00Z")
        command = bootstrap_command(STORE, target, "/pgdata", self.own)
        sh, dash_c, script = shlex.split(command)
        assert (sh, dash_c) == ("/bin/sh", "-c")
        check, restore, scrub = script.split(" && ")
        assert "postgresql.auto.conf" in scrub and "archive_command" in scrub
        assert shlex.split(check) == barman.check_wal_archive_argv(self.own)
        words = shlex.split(restore)
        assert words[0] == "AWS_ACCESS_KEY_ID=$PGOP_SOURCE_AWS_ACCESS_KEY_ID"
        assert words[-4:] == ["s3://backups/prod", "orders-db", "auto", "/pgdata"]
        fragment = patroni_bootstrap(STORE, target, "/pgdata", self.own)
        method = fragment["method"]
        assert fragment[method]["no_params"] is True
        assert fragment[method]["recovery_conf"] == recovery_settings(STORE, target)

    def test_never_into_the_source(self) -> None:
        assert recovery_conflict(STORE, self.own) is None
        assert recovery_conflict(STORE, None) is None
        assert recovery_conflict(STORE, STORE.with_server("orders-db")) is not None
        with pytest.raises(ValueError, match="archive into the source"):
            bootstrap_command(STORE, RecoveryTarget(), "/pgdata", STORE)


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("2026-12-01 08:01:21,209 [15344] ERROR: Barman cloud WAL archiver exception: An error occurred "
         "(SignatureDoesNotMatch) when calling the PutObject operation: The request signature ...",
         "InvalidCredentials"),
        ("ERROR: ... (InvalidAccessKeyId) when calling the PutObject operation", "InvalidCredentials"),
        ("ERROR: ... (NoSuchBucket) when calling the PutObject operation: The specified bucket does not",
         "BucketNotFound"),
        ('ERROR: exception: Could not connect to the endpoint URL: "http://127.0.0.1:9/x"',
         "EndpointUnreachable"),
        ("2026-12-01 08:01:21,209 [1] ERROR: WAL archive check failed for server x: Expected empty archive",
         "ArchiveNotEmpty"),
        ("ERROR: Cannot find any candidate backup for recovery.", "BackupNotFound"),
        ("Traceback ... KeyError: 'x'", "CommandFailed"),
    ],
)  # fmt: skip
def test_failure_reasons(output: str, reason: str) -> None:
    failure = classify(4, output)
    assert failure.reason == reason and failure.exit_status == 4
    assert "exit status 4" in failure.message
    assert not failure.message.startswith("2026")


def test_failure_messages_hold_no_secret_and_are_bounded() -> None:
    failure = classify(
        1, f"2026-12-01 08:00:00,000 [1] ERROR: key {SECRET} refused " + "x" * 2000, secrets=[SECRET]
    )
    assert SECRET not in failure.message and "<redacted>" in failure.message
    assert len(failure.message) <= 512


def test_pod_env_uses_secret_refs_only() -> None:
    env = barman_env(
        secret_name="s3", access_key_id_key="id", secret_access_key_key="key", region="eu-west-1"
    )
    by_name = {e["name"]: e for e in env}
    assert by_name["AWS_ACCESS_KEY_ID"]["valueFrom"] == {"secretKeyRef": {"name": "s3", "key": "id"}}
    assert by_name["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "s3", "key": "key"}}
    assert by_name["AWS_DEFAULT_REGION"]["value"] == "eu-west-1"
    assert by_name["AWS_RESPONSE_CHECKSUM_VALIDATION"]["value"] == "when_required"
    assert [e["name"] for e in env] == sorted(by_name)
    source = barman_env(
        secret_name="old", access_key_id_key="a", secret_access_key_key="b", prefix="PGOP_SOURCE_"
    )
    assert {e["name"] for e in source} == {
        "PGOP_SOURCE_AWS_ACCESS_KEY_ID",
        "PGOP_SOURCE_AWS_SECRET_ACCESS_KEY",
    }


def test_catalog() -> None:
    listed = {
        "backups_list": [
            {"backup_id": "20261201T080543", "end_time": "Tue Dec  1 08:05:46 2026", "status": "DONE"},
            {"backup_id": "20261201T070000", "end_time": None, "status": "STARTED"},
        ]
    }
    records = catalog.records(listed)
    assert [r.backup_id for r in records] == ["20261201T070000", "20261201T080543"]
    assert records[1].end_time == dt.datetime(2026, 12, 1, 8, 5, 46, tzinfo=dt.UTC) and records[1].completed
    assert not records[0].completed
    shown = {"cloud": {"backup_id": "20261201T080543", "begin_wal": "000000010000000000000002",
                       "end_wal": "000000010000000000000002", "begin_xlog": "0/2000028",
                       "end_xlog": "0/2000100",
                       "begin_time": "Tue Dec  1 08:05:43 2026", "end_time": "Tue Dec  1 08:05:46 2026",
                       "cluster_size": 22643269, "size": None, "status": "DONE", "timeline": 1}}  # fmt: skip
    status = catalog.backup_status(shown)
    assert status == {
        "backupID": "20261201T080543", "beginWal": "000000010000000000000002",
        "endWal": "000000010000000000000002", "beginLSN": "0/2000028", "endLSN": "0/2000100",
        "startedAt": "2026-12-01T08:05:43Z", "stoppedAt": "2026-12-01T08:05:46Z", "size": 22643269,
        "timeline": 1, "phase": "Completed",
    }  # fmt: skip
    failed = catalog.backup_status({"cloud": {**shown["cloud"], "status": "FAILED", "error": "boom"}})
    assert failed["phase"] == "Failed" and failed["error"] == "boom"
    with pytest.raises(ValueError, match="backups_list"):
        catalog.records({})
