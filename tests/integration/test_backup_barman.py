"""WAL archiving, base backups, point-in-time restore and retention with real parts: PostgreSQL 16 run as
an unprivileged user, barman-cloud, and an S3-compatible server (moto, with authentication) on loopback.
No Kubernetes: this proves the command lines and settings of pg_operator.backup before the pods use them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness.local_postgres import Harness, Postgres, as_user, etcd_server, patroni_venv
from harness.net import free_port
from harness.processes import stop_process
from harness.waiting import wait_until
from pg_operator.backup import catalog, instance_hook, instance_section
from pg_operator.backup.archive_gate import GATE_FILE, gate_line
from pg_operator.backup.archiving import ArchiveSettings, archiving_parameters
from pg_operator.backup.barman import (
    SECRET_KEY_ENV,
    ObjectStore,
    backup_list_argv,
    backup_show_argv,
    base_backup_argv,
    check_wal_archive_argv,
    delete_backup_argv,
    wal_archive_argv,
    wal_restore_argv,
)
from pg_operator.backup.catalog import backup_status
from pg_operator.backup.failures import classify
from pg_operator.backup.recovery import (
    RecoveryTarget,
    bootstrap_command,
    recovery_conflict,
    recovery_settings,
    source_env_names,
)
from pg_operator.backup.retention import RetentionPolicy, obsolete_backups

pytestmark = pytest.mark.timeout(900)

BUCKET = "backups"
SOURCE = "orders-db"


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    workdir = Path(tempfile.mkdtemp(prefix="pgop-backup-it-", dir="/var/tmp"))
    h = Harness(workdir)
    try:
        h.s3.client().create_bucket(Bucket=BUCKET)
        yield h
    finally:
        h.close()
        if os.environ.get("PGOP_KEEP_BACKUP_IT") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


def ok(h: Harness, argv: list[str]) -> str:
    res = h.barman(argv)
    assert res.returncode == 0, f"{Path(argv[0]).name} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def backups(h: Harness, store: ObjectStore) -> list[dict[str, object]]:
    listed = json.loads(ok(h, backup_list_argv(store)))
    return sorted(listed["backups_list"], key=lambda b: str(b["backup_id"]))


def wait_archived(pg: Postgres, segment: str, timeout: float = 120) -> None:
    def done() -> bool:
        ((last,),) = pg.query("SELECT last_archived_wal FROM pg_stat_archiver")
        return last is not None and last >= segment

    wait_until(f"{segment} to be archived", done, timeout)


def switch_and_archive(pg: Postgres) -> str:
    """Close the current WAL segment and wait until archive_command has shipped it."""
    ((segment,),) = pg.query("SELECT pg_walfile_name(pg_switch_wal())")
    wait_archived(pg, segment)
    return str(segment)


def source_untouched(h: Harness) -> bool:
    """The source keeps archiving its own timeline 1 (it is still running); a restored cluster writing
    there would add a timeline history file or timeline-2 segments."""
    foreign = [k for k in h.s3.keys(BUCKET, f"{SOURCE}/wals/") if ".history" in k or "/00000002" in k]
    assert not foreign, foreign
    return True


def restored_server(
    h: Harness, name: str, source: ObjectStore, target: RecoveryTarget, *, own_secret: str | None = None
) -> Postgres:
    """A new data directory from the source's backups, made by the bootstrap command Patroni would run,
    recovered to `target` with the recovery settings Patroni would write, then started and promoted. The
    source's credentials are only under PGOP_SOURCE_*; the plain AWS_* ones are the new cluster's own
    (`own_secret` replaces its secret key, to show which set each command uses)."""
    pg = h.postgres(name)
    pg.pgdata.parent.mkdir(parents=True)
    os.chown(pg.pgdata.parent, pg.user.pw_uid, pg.user.pw_gid)
    for variable, source_variable in source_env_names().items():
        pg.env[source_variable] = pg.env[variable]
    if own_secret is not None:
        pg.env[SECRET_KEY_ENV] = own_secret
    own = h.store(BUCKET, name)
    assert recovery_conflict(source, own) is None
    # With its own credentials broken, the new cluster cannot check its own path: leave the check out.
    command = bootstrap_command(source, target, str(pg.pgdata), own if own_secret is None else None)
    pg.run(shlex.split(command))
    # The source's ALTER SYSTEM settings came with the backup; its archive_command must not survive, or
    # the new cluster would archive into the source's path.
    auto_conf = (pg.pgdata / "postgresql.auto.conf").read_text()
    assert "archive_command" not in auto_conf and "max_slot_wal_keep_size" in auto_conf, auto_conf
    pg.configure(
        {
            **pg.base_parameters(),
            **archiving_parameters(ArchiveSettings(own, archive_timeout="60s")),
            **recovery_settings(source, target),
        }
    )
    (pg.pgdata / "recovery.signal").touch()
    os.chown(pg.pgdata / "recovery.signal", pg.user.pw_uid, pg.user.pw_gid)
    pg.start(timeout=300)
    return pg


@dataclass
class Scenario:
    source: Postgres
    store: ObjectStore
    target_time: str  # RFC 3339, between the two batches of rows
    before: int  # rows committed before target_time
    total: int
    first_backup_id: str


@pytest.fixture(scope="module")
def scenario(harness: Harness) -> Scenario:
    h = harness
    store = h.store(BUCKET, SOURCE)
    pg = h.postgres(SOURCE)
    pg.initdb()
    pg.configure({**pg.base_parameters(), **archiving_parameters(ArchiveSettings(store))})
    pg.start()
    pg.query("CREATE TABLE orders (id serial PRIMARY KEY, batch text NOT NULL, at timestamptz NOT NULL "
             "DEFAULT clock_timestamp())")  # fmt: skip
    pg.query("INSERT INTO orders (batch) SELECT 'base' FROM generate_series(1, 100)")

    out = ok(h, base_backup_argv(store, name="base-1", host="127.0.0.1", port=pg.port, user="postgres"))
    assert "ERROR" not in out
    (first,) = backups(h, store)
    assert first["status"] == "DONE" and first["backup_name"] == "base-1"

    pg.query("INSERT INTO orders (batch) SELECT 'before' FROM generate_series(1, 50)")
    time.sleep(1.0)
    ((target,),) = pg.query("SELECT clock_timestamp()")
    time.sleep(1.0)
    pg.query("INSERT INTO orders (batch) SELECT 'after' FROM generate_series(1, 70)")
    switch_and_archive(pg)
    target_rfc3339 = target.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return Scenario(pg, store, target_rfc3339, before=150, total=220, first_backup_id=str(first["backup_id"]))


def test_wal_is_archived_under_the_clusters_own_prefix(harness: Harness, scenario: Scenario) -> None:
    keys = harness.s3.keys(BUCKET)
    assert keys and all(k.startswith(f"{SOURCE}/") for k in keys), keys[:5]
    wals = [k for k in keys if k.startswith(f"{SOURCE}/wals/")]
    assert any(k.endswith(".gz") for k in wals), "gzip compression of archived WAL"
    ((archived, failed),) = scenario.source.query("SELECT archived_count, failed_count FROM pg_stat_archiver")
    assert archived >= 3 and failed == 0
    shown = json.loads(ok(harness, backup_show_argv(scenario.store, scenario.first_backup_id)))
    status = backup_status(shown)
    assert status["phase"] == "Completed" and status["backupID"] == scenario.first_backup_id
    assert status["beginWal"] <= status["endWal"] and status["beginWal"].startswith("00000001")
    assert status["size"] > 10_000_000 and status["startedAt"] <= status["stoppedAt"]
    base = [k for k in keys if k.startswith(f"{SOURCE}/base/{scenario.first_backup_id}/")]
    assert any(k.endswith("data.tar.gz") for k in base), base


def test_point_in_time_restore_has_exactly_the_rows_before_the_target(
    harness: Harness, scenario: Scenario
) -> None:
    pg = restored_server(harness, "orders-pitr", scenario.store, RecoveryTarget(time=scenario.target_time))
    rows = dict(pg.query("SELECT batch, count(*) FROM orders GROUP BY batch"))
    assert rows == {"base": 100, "before": 50}, rows
    pg.query("CHECKPOINT")
    ((timeline,),) = pg.query("SELECT timeline_id FROM pg_control_checkpoint()")
    assert timeline == 2, "promotion after recovery starts a new timeline"
    # It archives under its own name; the source's path is untouched.
    pg.query("INSERT INTO orders (batch) SELECT 'restored' FROM generate_series(1, 5)")
    switch_and_archive(pg)
    own = harness.s3.keys(BUCKET, "orders-pitr/")
    assert any(k.endswith("00000002.history.gz") for k in own), own
    assert source_untouched(harness)
    pg.stop()


def test_restore_to_the_latest_point_has_every_row(harness: Harness, scenario: Scenario) -> None:
    # Its own secret key is wrong: the restore and WAL replay can only have used the source's credentials.
    pg = restored_server(harness, "orders-latest", scenario.store, RecoveryTarget(), own_secret="wrong")
    ((count,),) = pg.query("SELECT count(*) FROM orders")
    assert count == scenario.total

    # ... and its own archiving uses its own (wrong) credentials, so it fails, visibly.
    def archive_failing() -> bool:
        ((failed, last_failed),) = pg.query("SELECT failed_count, last_failed_wal FROM pg_stat_archiver")
        return failed > 0 and last_failed is not None

    wait_until("the restored cluster's own archiving to fail", archive_failing, 60)
    assert harness.s3.keys(BUCKET, "orders-latest/") == []
    pg.stop()


def test_patroni_restores_with_the_custom_bootstrap(harness: Harness, scenario: Scenario) -> None:
    """The Patroni side, end to end: a Patroni 4 (etcd v3 as its DCS) whose config is a plain one with
    instance_hook.apply() laid over it, as the instance entrypoint will do. It bootstraps by the custom
    method (check own path, barman-cloud-restore, scrub), recovers to the target, promotes, and archives
    under its own name."""
    h, name = harness, "orders-patroni"
    patroni_bin = patroni_venv()
    base = h.workdir / name
    base.mkdir(mode=0o700)
    os.chown(base, h.user.pw_uid, h.user.pw_gid)
    pgdata = base / "pgdata"
    pg_port, api_port = free_port(), free_port()
    backup = instance_section.section(
        ArchiveSettings(h.store(BUCKET, name)),
        instance_section.RecoveryPlan(scenario.store, RecoveryTarget(time=scenario.target_time)),
    )
    with etcd_server(h.workdir) as etcd:
        plain = {
            "scope": name,
            "name": f"{name}-0",
            "restapi": {"listen": f"127.0.0.1:{api_port}", "connect_address": f"127.0.0.1:{api_port}"},
            "etcd3": {"hosts": [etcd]},
            "bootstrap": {
                "dcs": {"ttl": 20, "loop_wait": 2, "retry_timeout": 5},
                "initdb": ["data-checksums"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{pg_port}",
                "connect_address": f"127.0.0.1:{pg_port}",
                "data_dir": str(pgdata),
                "bin_dir": str(h.pg_home / "bin"),
                "pgpass": str(base / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "it-superuser"},
                    "replication": {"username": "replicator", "password": "it-replication"},
                },
                "parameters": {"unix_socket_directories": str(base)},
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
        }
        config = instance_hook.apply(plain, backup, pgdata=str(pgdata), bin_dir=str(h.barman_bin))
        # archive_command waits behind the gate in the socket directory until the operator opens it; this
        # cluster owns its prefix here, so the test opens it as the operator would.
        gate = base / GATE_FILE
        gate.write_text(gate_line("archive", h.store(BUCKET, name)) + "\n")
        os.chown(gate, h.user.pw_uid, h.user.pw_gid)
        config_file = base / "patroni.yml"
        config_file.write_text(yaml.safe_dump(config))
        os.chown(config_file, h.user.pw_uid, h.user.pw_gid)
        env = {
            "PATH": f"{h.pg_home / 'bin'}:{h.barman_bin}:/usr/bin:/bin",
            "LD_LIBRARY_PATH": str(h.pg_home / "lib"),
            "HOME": str(base),
            **h.s3.env(),
        }
        for variable, source_variable in source_env_names().items():
            env[source_variable] = env[variable]
        log = base / "patroni.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(as_user(h.user, [str(patroni_bin / "patroni"), str(config_file)]),
                                    stdout=out, stderr=out, env=env, cwd="/")  # fmt: skip
        try:

            def primary() -> bool:
                assert proc.poll() is None, log.read_text()[-4000:]
                with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/primary", timeout=2) as r:
                    return bool(r.status == 200)

            wait_until("Patroni to bootstrap from the backup and lead", primary, 300)
            pg = Postgres(name, pgdata, pg_port, h.pg_home, h.user, env)
            rows = dict(pg.query("SELECT batch, count(*) FROM orders GROUP BY batch"))
            assert rows == {"base": 100, "before": 50}, rows
            pg.query("CHECKPOINT")
            ((timeline,),) = pg.query("SELECT timeline_id FROM pg_control_checkpoint()")
            assert timeline == 2
            ((command,),) = pg.query("SHOW archive_command")
            assert f" {name} %p ;; " in command and GATE_FILE in command
            pg.query("INSERT INTO orders (batch) VALUES ('patroni')")
            switch_and_archive(pg)
            assert any(k.endswith("00000002.history.gz") for k in h.s3.keys(BUCKET, f"{name}/"))
            assert source_untouched(h)
            assert "Running custom bootstrap script" in log.read_text()
        finally:
            stop_process(proc, timeout=60)


def test_a_restore_that_would_archive_into_the_source_is_refused(scenario: Scenario) -> None:
    assert recovery_conflict(scenario.store, scenario.store.with_server(SOURCE)) is not None


def test_new_cluster_refuses_an_archive_path_that_holds_wal(harness: Harness, scenario: Scenario) -> None:
    res = harness.barman(check_wal_archive_argv(scenario.store))
    failure = classify(res.returncode, res.stdout + res.stderr)
    assert res.returncode != 0 and failure.reason == "ArchiveNotEmpty", (res.returncode, res.stderr)


def test_retention_deletes_the_oldest_and_keeps_the_latest(harness: Harness, scenario: Scenario) -> None:
    h, store, pg = harness, scenario.store, scenario.source
    for name in ("base-2", "base-3"):
        pg.query("INSERT INTO orders (batch) SELECT 'more' FROM generate_series(1, 10)")
        ok(h, base_backup_argv(store, name=name, host="127.0.0.1", port=pg.port, user="postgres"))
        switch_and_archive(pg)
    listed = backups(h, store)
    assert [b["backup_name"] for b in listed] == ["base-1", "base-2", "base-3"]
    records = catalog.records(json.loads(ok(h, backup_list_argv(store))))
    now = max(r.end_time for r in records if r.end_time) + dt.timedelta(seconds=1)
    doomed = obsolete_backups(records, RetentionPolicy(keep_last=2), now)
    assert doomed == [scenario.first_backup_id]
    oldest_wal_before = min(k for k in h.s3.keys(BUCKET, f"{SOURCE}/wals/") if k.endswith(".gz"))
    for backup_id in doomed:
        ok(h, delete_backup_argv(store, backup_id))
    assert [b["backup_name"] for b in backups(h, store)] == ["base-2", "base-3"]
    # WAL only the deleted backup needed went with it.
    second_begin = str(listed[1]["begin_wal"])
    remaining = [k for k in h.s3.keys(BUCKET, f"{SOURCE}/wals/") if k.endswith(".gz")]
    assert oldest_wal_before not in remaining
    assert all(Path(k).name.split(".")[0] >= second_begin for k in remaining)

    # keepLast 1, applied as the operator does (its own decision, one delete per backup): only the newest.
    records = catalog.records(json.loads(ok(h, backup_list_argv(store))))
    for backup_id in obsolete_backups(records, RetentionPolicy(keep_last=1), now):
        ok(h, delete_backup_argv(store, backup_id))
    assert [b["backup_name"] for b in backups(h, store)] == ["base-3"]
    # And never the last one, whatever the window says.
    (last,) = backups(h, store)
    (record,) = catalog.records(json.loads(ok(h, backup_list_argv(store))))
    assert record.end_time is not None and record.backup_id == last["backup_id"]
    far_future = record.end_time + dt.timedelta(days=400)
    assert obsolete_backups([record], RetentionPolicy(recovery_window="7d"), far_future) == []


@pytest.mark.parametrize(
    ("case", "reason"),
    [("bad-credentials", "InvalidCredentials"), ("missing-bucket", "BucketNotFound"),
     ("unreachable-endpoint", "EndpointUnreachable")],
)  # fmt: skip
def test_store_failures_have_a_clear_reason(
    harness: Harness, scenario: Scenario, case: str, reason: str
) -> None:
    h = harness
    store, env = scenario.store, {}
    if case == "bad-credentials":
        env = h.s3.env(secret_access_key="not-the-secret")
    elif case == "missing-bucket":
        store = h.store("no-such-bucket", SOURCE)
    else:
        store = ObjectStore(bucket=BUCKET, server_name=SOURCE, endpoint_url="http://127.0.0.1:9",
                            bin_dir=str(h.barman_bin))  # fmt: skip
    (h.workdir / case).mkdir(mode=0o755)
    wal = h.workdir / case / "0000000100000000000000FE"
    wal.write_bytes(b"\0" * 1024)
    wal.chmod(0o644)
    argv = [a if a != "%p" else str(wal) for a in wal_archive_argv(store)]
    res = h.barman(argv, env=env, timeout=180)
    failure = classify(res.returncode, res.stdout + res.stderr, secrets=[h.s3.secret_access_key])
    assert res.returncode != 0, res
    assert failure.reason == reason, failure
    assert h.s3.secret_access_key not in failure.message
    assert f"exit status {res.returncode}" in failure.message
    # Same through a base backup (the controller's path).
    res = h.barman(base_backup_argv(store, name=f"fail-{case}", host="127.0.0.1", port=scenario.source.port,
                                    user="postgres"), env=env, timeout=180)  # fmt: skip
    failure = classify(res.returncode, res.stdout + res.stderr, secrets=[h.s3.secret_access_key])
    print(json.dumps({"case": case, "tool": "barman-cloud-backup", "exit": res.returncode,
                      "reason": failure.reason, "message": failure.message}))  # fmt: skip
    # barman-cloud-backup does not create a missing bucket either: the same three reasons.
    assert res.returncode != 0 and failure.reason == reason, failure
    assert h.s3.secret_access_key not in failure.message


@pytest.mark.parametrize(
    ("compression", "suffix"), [("gzip", ".gz"), ("bzip2", ".bz2"), ("snappy", ".snappy"), ("none", "")]
)
def test_every_compression_round_trips_a_segment(
    harness: Harness, scenario: Scenario, compression: str, suffix: str
) -> None:
    h = harness
    store = h.store(BUCKET, f"wal-{compression}", compression=compression)
    (h.workdir / f"seg-{compression}").mkdir()
    (h.workdir / f"seg-{compression}").chmod(0o777)
    pg_wal = scenario.source.pgdata / "pg_wal"
    first = min(p.name for p in pg_wal.iterdir() if re.fullmatch("[0-9A-F]{24}", p.name))
    segment = h.workdir / f"seg-{compression}" / first
    shutil.copyfile(pg_wal / first, segment)
    segment.chmod(0o644)
    ok(h, [a if a != "%p" else str(segment) for a in wal_archive_argv(store)])
    (key,) = h.s3.keys(BUCKET, f"wal-{compression}/wals/")
    assert key.endswith(f"/{segment.name}{suffix}"), key
    restored = segment.with_name("restored")
    ok(h, [str(restored) if a == "%p" else segment.name if a == "%f" else a for a in wal_restore_argv(store)])
    assert restored.read_bytes() == segment.read_bytes()


def test_failing_archive_is_visible_keeps_wal_and_drains_when_fixed(harness: Harness) -> None:
    h = harness
    broken = h.store("bucket-that-does-not-exist", "broken-db")
    pg = h.postgres("broken-db")
    pg.initdb()
    settings = ArchiveSettings(broken, wal_max_keep_size="64MB")
    pg.configure({**pg.base_parameters(), **archiving_parameters(settings), "max_wal_size": "64MB",
                  "min_wal_size": "32MB"})  # fmt: skip
    pg.start()
    pg.query("CREATE TABLE filler (v text)")
    for _ in range(4):
        pg.query("INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)")
        pg.query("SELECT pg_switch_wal()")

    def failing() -> tuple[int, str]:
        ((failed, last_failed, archived),) = pg.query(
            "SELECT failed_count, last_failed_wal, archived_count FROM pg_stat_archiver"
        )
        assert archived == 0
        return (failed, last_failed) if failed >= 3 and last_failed else (0, "")

    failed, last_failed = wait_until(
        "archive failures in pg_stat_archiver", lambda: failing()[0] and failing(), 120
    )
    pg.query("CHECKPOINT")
    ready = sorted(p.name for p in (pg.pgdata / "pg_wal" / "archive_status").glob("*.ready"))
    assert len(ready) >= 4, ready
    # Unarchived segments stay in pg_wal through checkpoints: nothing is lost, the disk fills instead.
    assert all((pg.pgdata / "pg_wal" / r.removesuffix(".ready")).exists() for r in ready)
    ((keep,),) = pg.query("SHOW max_slot_wal_keep_size")
    assert keep == "64MB"

    # A slot that nobody reads is cut off at max_slot_wal_keep_size instead of pinning WAL for ever.
    pg.query("SELECT pg_create_physical_replication_slot('gone_replica', true)")
    fixed = h.store(BUCKET, "broken-db")
    pg.configure(archiving_parameters(ArchiveSettings(fixed, wal_max_keep_size="64MB")))
    pg.query("SELECT pg_reload_conf()")
    for _ in range(6):
        pg.query("INSERT INTO filler SELECT repeat('y', 1000) FROM generate_series(1, 10000)")
        pg.query("SELECT pg_switch_wal()")
    segment = switch_and_archive(pg)
    pg.query("CHECKPOINT")
    ((status,),) = pg.query("SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'gone_replica'")
    assert status in ("lost", "unreserved"), status
    # The backlog drained once archiving worked again.
    assert not list((pg.pgdata / "pg_wal" / "archive_status").glob(f"{last_failed}.ready"))
    assert any(k.endswith(f"{last_failed}.gz") for k in h.s3.keys(BUCKET, "broken-db/wals/"))
    assert segment > last_failed and failed >= 3
    pg.stop()
