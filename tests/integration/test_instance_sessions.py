"""The instance's own sessions against a real PostgreSQL 16: who they log in as and which names they
resolve.

The server runs as the unprivileged test user with exactly the pg_hba.conf and pg_ident.conf lines the
entrypoint renders for Patroni (patroni_config), the operating-system user of the peer maps being this
test's own, so the instance code run here connects over the Unix socket as it does in a pod.

Attacks, as a tenant who owns a database and its `public` schema would try them:
- the archive reporter's session must be its own least-privileged role, not the superuser's one
  `RESET SESSION AUTHORIZATION` away;
- `ALTER DATABASE postgres SET search_path = evil, pg_catalog` with functions and an operator in `evil`
  shadowing what the sessions call: none of them may ever run.
"""

from __future__ import annotations

import contextlib
import getpass
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import local_postgres, patroni_instance
from harness.net import free_port
from harness.waiting import wait_until
from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.instance import (
    archive_reporter,
    metrics_server,
    patroni_config,
    post_bootstrap,
    session_roles,
)
from pg_operator.instance.inputs import Credentials

pytestmark = pytest.mark.timeout(300)

SUPERUSER = "postgres"

# Shadows of what the instance's sessions call, each recording who called it. A tenant can plant these
# in any schema it owns; the database's search_path then puts them first.
EVIL = """
CREATE SCHEMA evil;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE TABLE evil.calls (fn text, caller text);
GRANT INSERT ON evil.calls TO PUBLIC;
CREATE FUNCTION evil.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('pg_is_in_recovery', session_user);
  SELECT pg_catalog.pg_is_in_recovery();
$$;
CREATE FUNCTION evil.current_setting(text) RETURNS text LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('current_setting', session_user);
  SELECT pg_catalog.current_setting($1);
$$;
CREATE FUNCTION evil.pg_ls_archive_statusdir(OUT name text, OUT size bigint, OUT modification timestamptz)
  RETURNS SETOF record LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('pg_ls_archive_statusdir', session_user);
  SELECT * FROM pg_catalog.pg_ls_archive_statusdir();
$$;
CREATE FUNCTION evil.name_eq(name, name) RETURNS boolean LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('=(name,name)', session_user);
  SELECT $1 OPERATOR(pg_catalog.=) $2;
$$;
CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = name, FUNCTION = evil.name_eq);
CREATE FUNCTION evil.name_text_eq(name, text) RETURNS boolean LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('=(name,text)', session_user);
  SELECT $1 OPERATOR(pg_catalog.=) $2;
$$;
CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = text, FUNCTION = evil.name_text_eq);
ALTER DATABASE postgres SET search_path = evil, pg_catalog;
"""


class Server:
    """PostgreSQL 16 with the instance's pg_hba and pg_ident; `superuser()` connects as the entrypoint's
    peer map lets it."""

    def __init__(self, pg: local_postgres.Postgres) -> None:
        self.pg = pg

    @property
    def socket_dir(self) -> str:
        return str(self.pg.socket_dir)

    def dsn(self, user: str = SUPERUSER) -> str:
        return f"host={self.socket_dir} port={self.pg.port} dbname=postgres user={user}"

    def superuser(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn(), autocommit=True)

    def plant(self) -> None:
        with self.superuser() as conn:
            conn.execute(EVIL)

    def shadow_calls(self) -> list[tuple[str, str]]:
        with self.superuser() as conn:
            # This session resolves with the planted path too: read through qualified names only.
            rows = conn.execute("SELECT fn, caller FROM evil.calls ORDER BY fn").fetchall()
        return [(str(fn), str(caller)) for fn, caller in rows]


@pytest.fixture
def server(postgresql_16: Path) -> Iterator[Server]:
    user = local_postgres.run_user()
    work = patroni_instance.runtime_dir() / f"sessions-{uuid.uuid4().hex[:6]}"
    work.mkdir(mode=0o755)
    env = {"PATH": f"{postgresql_16 / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(postgresql_16 / "lib"),
           "LANG": "C.UTF-8", "HOME": "/nonexistent"}  # fmt: skip
    pg = local_postgres.Postgres("sessions", work / "pgdata", free_port(), postgresql_16, user, env)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        pg.initdb()
        pg.configure(
            {
                **pg.base_parameters(),
                "archive_mode": "on",
                "archive_command": "/bin/true",
                "hba_file": str(work / "pg_hba.conf"),
                "ident_file": str(work / "pg_ident.conf"),
            }
        )
        hba = patroni_config.pg_hba(superuser=SUPERUSER, replication="replicator", networks=["127.0.0.1/32"])
        ident = patroni_config.pg_ident(os_user=getpass.getuser(), superuser=SUPERUSER)
        (work / "pg_hba.conf").write_text("\n".join(hba) + "\n")
        (work / "pg_ident.conf").write_text("\n".join(ident) + "\n")
        pg.start(wait_ready=False)
        stack.callback(pg.stop)
        s = Server(pg)

        def ready() -> bool:
            if pg.proc is not None and pg.proc.poll() is not None:
                raise AssertionError(f"PostgreSQL exited {pg.proc.returncode}:\n{pg.log.read_text()[-3000:]}")
            try:
                with s.superuser() as conn:
                    return conn.execute("SELECT NOT pg_catalog.pg_is_in_recovery()").fetchone() == (True,)
            except psycopg.OperationalError:
                return False

        wait_until("PostgreSQL 16 to accept writes over its socket", ready, 120, interval=0.2)
        yield s


def reporter(s: Server) -> archive_reporter.ArchiveReporter:
    # The Kubernetes side is never called here: only the PostgreSQL session is under test.
    return archive_reporter.ArchiveReporter(
        socket_dir=s.socket_dir, pg_port=s.pg.port, patcher=archive_reporter.PodPatcher("ns", "pod")
    )


def is_superuser(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) current_user"
    ).fetchone()
    assert row is not None
    return bool(row[0])


def test_the_archive_reporter_logs_in_as_its_own_role_and_cannot_become_the_superuser(server: Server) -> None:
    s = server
    assert session_roles.ensure_monitor_role(socket_dir=s.socket_dir, pg_port=s.pg.port, superuser=SUPERUSER)
    conn = reporter(s).session()
    assert conn.execute("SELECT session_user, current_user").fetchone() == (MONITOR_ROLE, MONITOR_ROLE)
    conn.execute("RESET SESSION AUTHORIZATION")
    conn.execute("RESET ROLE")
    assert conn.execute("SELECT session_user").fetchone() == (MONITOR_ROLE,)
    assert not is_superuser(conn)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f'SET SESSION AUTHORIZATION "{SUPERUSER}"')
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f'SET ROLE "{SUPERUSER}"')
    # And with that least privilege it still reads what it reports (pg_monitor suffices).
    report = reporter(s).read()
    assert report is not None and report.stats.archived_count >= 0


def test_the_monitor_role_logs_in_over_the_socket_only(server: Server) -> None:
    s = server
    session_roles.ensure_monitor_role(socket_dir=s.socket_dir, pg_port=s.pg.port, superuser=SUPERUSER)
    with psycopg.connect(s.dsn(MONITOR_ROLE)) as conn:
        assert conn.execute("SELECT session_user").fetchone() == (MONITOR_ROLE,)
    # /metrics as the entrypoint now starts it (main.start_metrics): logged in as the role itself, and
    # pg_monitor suffices for every query of a scrape.
    collector = metrics_server.Collector(socket_dir=s.socket_dir, port=s.pg.port, login_user=MONITOR_ROLE)
    scrape = collector.collect()
    assert "\npg_up 1\n" in "\n" + scrape, collector.last_error
    assert collector.errors == 0
    # Over the socket it may enter every database (the operator's read-back of declared databases logs
    # in as it; their CONNECT privilege still applies), over TCP none.
    with psycopg.connect(
        f"host={s.socket_dir} port={s.pg.port} dbname=template1 user={MONITOR_ROLE}"
    ) as conn:
        assert conn.execute("SELECT session_user").fetchone() == (MONITOR_ROLE,)
    with pytest.raises(psycopg.OperationalError, match=r"rejects connection"):
        psycopg.connect(
            f"host=127.0.0.1 port={s.pg.port} dbname=postgres user={MONITOR_ROLE} sslmode=disable"
        )


def test_a_planted_search_path_is_not_used_by_the_instances_sessions(server: Server) -> None:
    s = server
    s.plant()
    # The planted path is in effect for an ordinary session (the attack is real) …
    with s.superuser() as conn:
        assert conn.execute("SHOW search_path").fetchone() == ("evil, pg_catalog",)
        conn.execute("SELECT pg_is_in_recovery()")
    assert s.shadow_calls() == [("pg_is_in_recovery", SUPERUSER)]
    with s.superuser() as conn:
        conn.execute("TRUNCATE evil.calls")

    # … and none of the instance's sessions resolves through it: the role keeper (superuser) …
    assert session_roles.ensure_monitor_role(socket_dir=s.socket_dir, pg_port=s.pg.port, superuser=SUPERUSER)
    # … post-bootstrap after a restore (superuser; the catalog is the source's, planted path included) …
    app = Credentials("app", "a-password-for-the-test")
    post_bootstrap.create_app_owner_and_database(s.dsn(), app, "appdb", restored=True)
    # … and the archive reporter (its own role).
    r = reporter(s)
    assert r.read() is not None
    assert s.shadow_calls() == []
    assert r.session().execute("SHOW search_path").fetchone() == ("pg_catalog,pg_temp",)
