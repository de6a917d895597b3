"""The major upgrade's data-plane steps on real PostgreSQL 16 and 17 servers (the binaries the images
ship, run on this host as an unprivileged user), exactly as the pods run them: the live
`pg_upgrade --check` passes on a clean cluster (keeping its new cluster, which the upgrade then takes)
and fails with pg_upgrade's own reason on a reg* column, leaving the running server untouched;
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

import pytest

from harness.binaries import postgresql_binaries
from harness.local_postgres import RUNTIME, Postgres, as_user, run_user
from harness.net import free_port
from pg_operator.orchestration import major_upgrade as mu

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
    ok = run_script(old, mu.check_script(steps))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Clusters are compatible" in ok.stdout
    # The checked new cluster is kept for the upgrade (its initdb then costs no downtime).
    assert (Path(steps.prepared_pgdata) / "PG_VERSION").read_text().strip() == "17"

    old.query("CREATE TABLE lookups (r regproc)")
    old.query("INSERT INTO lookups VALUES ('now')")
    bad = run_script(old, mu.check_script(steps))
    assert bad.returncode != 0
    reason = mu.check_failure_reason(bad.stdout + "\n" + bad.stderr)
    assert "reg*" in reason, reason
    assert "Clusters are compatible" not in reason
    # Untouched: still serving writes on 16, the throwaway cluster gone.
    old.query("INSERT INTO items VALUES (0, 'after the check')")
    assert old.query("SELECT count(*), current_setting('server_version') FROM items") == [(ROWS + 1, OLD)]
    assert (old.pgdata / "PG_VERSION").read_text().strip() == "16"
    assert not Path(steps.check_pgdata).exists() and not Path(steps.prepared_pgdata).exists()


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
    checked = run_script(old, mu.check_script(steps))
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
