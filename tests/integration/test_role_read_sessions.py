"""The roles read-back against a real PostgreSQL 16: who it logs in as inside the databases a tenant owns.

The server runs with exactly the pg_hba.conf and pg_ident.conf lines the entrypoint renders for Patroni
(patroni_config), the operating-system user of the peer maps being this test's own, and the script is
the one the roles sub-reconciler sends (role_reads.observe_sql), run by psql with the operator's own
argv (pod_exec.PSQL) but for the socket's directory and port. The server logs every connection it
authorizes: that record says which role entered which database.

Attacks, as a tenant who owns a declared database would try them:
- plant functions and an operator shadowing what a read-back calls, put them first in the database's
  search path and set the database's `role` and `session_authorization` to itself: nothing planted may
  run, and inside the tenant's database the read-back must be the monitoring role, never the superuser;
- `REVOKE CONNECT … FROM PUBLIC` or `CONNECTION LIMIT 0` on its database: the read-back must report that
  database as unread (naming it), plan nothing inside it, read everything else, and never fall back to
  the superuser there.
And an instance on an older image, whose pg_hba admits the monitoring role to `postgres` only, is still
read (as the superuser, pinned, as before), and the result says so.
"""

from __future__ import annotations

import contextlib
import getpass
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import local_postgres, patroni_instance
from harness.net import free_port
from harness.waiting import wait_until
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.controller.pod_exec import PSQL, SOCKET_DIR
from pg_operator.instance import patroni_config, session_roles
from pg_operator.specs import role_reads
from pg_operator.specs.role_changes import converge
from pg_operator.specs.roles import Passwords

pytestmark = pytest.mark.timeout(300)

SUPERUSER = "postgres"
TENANT = "alice"

# What the tenant plants in its own database, each shadow recording who called it.
TRAPS = """
CREATE SCHEMA evil;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
CREATE TABLE evil.calls (fn text, caller text);
GRANT INSERT ON evil.calls TO PUBLIC;
CREATE FUNCTION evil.pg_get_userbyid(oid) RETURNS name LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('pg_get_userbyid', session_user);
  SELECT pg_catalog.pg_get_userbyid($1);
$$;
CREATE FUNCTION evil.current_database() RETURNS name LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('current_database', session_user);
  SELECT pg_catalog.current_database();
$$;
CREATE FUNCTION evil.name_eq(name, name) RETURNS boolean LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('=(name,name)', session_user);
  SELECT $1 OPERATOR(pg_catalog.=) $2;
$$;
CREATE OPERATOR evil.= (LEFTARG = name, RIGHTARG = name, FUNCTION = evil.name_eq);
CREATE FUNCTION evil.name_any(name, text[]) RETURNS boolean LANGUAGE sql AS $$
  INSERT INTO evil.calls VALUES ('=(name,text[])', session_user);
  SELECT $1 OPERATOR(pg_catalog.=) ANY ($2);
$$;
CREATE VIEW evil.pg_namespace AS SELECT * FROM pg_catalog.pg_namespace
  WHERE evil.name_eq(nspname, nspname);
CREATE VIEW evil.pg_extension AS SELECT * FROM pg_catalog.pg_extension
  WHERE evil.name_eq(extname, extname);
GRANT SELECT ON evil.pg_namespace, evil.pg_extension TO PUBLIC;
CREATE SCHEMA sales;
"""
# The tenant's database settings: its path first, and the session turned into the tenant if it can be.
SETTINGS = [
    "ALTER DATABASE {db} SET search_path = evil, pg_catalog",
    "ALTER DATABASE {db} SET role = {tenant}",
    "ALTER DATABASE {db} SET session_authorization = {tenant}",
]
# The monitoring role's line as instances on images before this change render it.
OLDER_MONITOR_LINE = f'local postgres "{MONITOR_ROLE}" peer map={patroni_config.MONITOR_IDENT_MAP}'


def declared(*databases: str) -> PostgresCluster:
    spec = {
        "replicas": 1,
        "version": "16",
        "storage": "1Gi",
        "roles": [{"name": TENANT}],
        "databases": [{"name": db, "owner": TENANT, "schemas": [{"name": "sales"}]} for db in databases],
    }
    return PostgresCluster.from_obj(
        {"metadata": {"name": "db", "namespace": "ns", "uid": "u", "generation": 1}, "spec": spec}
    )


@dataclass
class Server:
    pg: local_postgres.Postgres
    psql: str

    @property
    def socket_dir(self) -> str:
        return str(self.pg.socket_dir)

    def connect(self, dbname: str = "postgres", user: str = SUPERUSER) -> psycopg.Connection[Any]:
        return psycopg.connect(host=self.socket_dir, port=self.pg.port, dbname=dbname, user=user,
                               autocommit=True)  # fmt: skip

    def tenant_database(self, db: str) -> None:
        """`db` owned by the tenant, who plants its traps there and sets the database's settings."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{db}" OWNER "{TENANT}"')
        with self.connect(db) as conn:
            # As the tenant: what it does, it does with its own rights (the owner of the database and,
            # on 15+, of its `public` schema).
            conn.execute(f'SET ROLE "{TENANT}"')
            conn.execute(TRAPS)
            for statement in SETTINGS:
                conn.execute(statement.format(db=f'"{db}"', tenant=f'"{TENANT}"'))

    def as_tenant(self, db: str, statement: str) -> None:
        with self.connect(db) as conn:
            conn.execute(f'SET ROLE "{TENANT}"')
            conn.execute(statement)

    def calls(self, db: str) -> list[tuple[str, str]]:
        with self.connect(db) as conn:
            conn.execute("SET search_path = pg_catalog")
            rows = conn.execute("SELECT fn, caller FROM evil.calls ORDER BY fn").fetchall()
        return [(str(fn), str(caller)) for fn, caller in rows]

    def authorized(self) -> list[tuple[str, str]]:
        """(role, database) of every connection the server authorized so far."""
        pattern = re.compile(r"connection authorized: user=(\S+) database=(\S+)")
        return [(m.group(1), m.group(2)) for m in pattern.finditer(self.pg.log.read_text())]

    def read_back(self, cluster: PostgresCluster, read_last: tuple[str, ...] = ()
                  ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """The read-back as the sub-reconciler runs it in the pod: the operator's argv (pinned options
        included), here with this server's socket directory and port."""
        argv = [self.socket_dir if a == SOCKET_DIR else self.psql if a == "psql" else a for a in PSQL]
        script = role_reads.observe_sql(cluster, read_last)
        return subprocess.run([*argv, "-p", str(self.pg.port), "-q", "-f", "-"], input=script,
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def start(hba: list[str]) -> Iterator[Server]:
    pg16 = patroni_instance.postgresql_16()
    user = local_postgres.run_user()
    work = patroni_instance.runtime_dir() / f"reads-{uuid.uuid4().hex[:6]}"
    work.mkdir(mode=0o755)
    env = {"PATH": f"{pg16 / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(pg16 / "lib"),
           "LANG": "C.UTF-8", "HOME": "/nonexistent"}  # fmt: skip
    pg = local_postgres.Postgres("reads", work / "pgdata", free_port(), pg16, user, env)
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        pg.initdb()
        pg.configure({**pg.base_parameters(), "log_connections": "on", "hba_file": str(work / "pg_hba.conf"),
                      "ident_file": str(work / "pg_ident.conf")})  # fmt: skip
        ident = patroni_config.pg_ident(os_user=getpass.getuser(), superuser=SUPERUSER)
        (work / "pg_hba.conf").write_text("\n".join(hba) + "\n")
        (work / "pg_ident.conf").write_text("\n".join(ident) + "\n")
        pg.start(wait_ready=False)
        stack.callback(pg.stop)
        s = Server(pg, str(pg16 / "bin" / "psql"))

        def ready() -> bool:
            if pg.proc is not None and pg.proc.poll() is not None:
                raise AssertionError(f"PostgreSQL exited {pg.proc.returncode}:\n{pg.log.read_text()[-3000:]}")
            try:
                with s.connect() as conn:
                    return conn.execute("SELECT NOT pg_catalog.pg_is_in_recovery()").fetchone() == (True,)
            except psycopg.OperationalError:
                return False

        wait_until("PostgreSQL 16 to accept writes over its socket", ready, 120, interval=0.2)
        assert session_roles.ensure_monitor_role(
            socket_dir=s.socket_dir, pg_port=pg.port, superuser=SUPERUSER
        )
        with s.connect() as conn:
            conn.execute(f'CREATE ROLE "{TENANT}" LOGIN')
        yield s


def rendered_hba() -> list[str]:
    return patroni_config.pg_hba(superuser=SUPERUSER, replication="replicator", networks=["127.0.0.1/32"])


@pytest.fixture
def server(postgresql_16: Path) -> Iterator[Server]:
    yield from start(rendered_hba())


@pytest.fixture
def older_server(postgresql_16: Path) -> Iterator[Server]:
    """pg_hba as an instance on an older image has it: the monitoring role admitted to `postgres` only."""
    hba = [line for line in rendered_hba() if f'"{MONITOR_ROLE}" peer' not in line]
    yield from start([hba[0], OLDER_MONITOR_LINE, *hba[1:]])


def observed(result: subprocess.CompletedProcess[str]) -> role_reads.Observed:
    assert result.returncode == 0, result.stderr
    return role_reads.parse_observed(result.stdout)


def test_inside_a_tenants_database_the_read_back_is_the_monitoring_role(server: Server) -> None:
    s = server
    s.tenant_database("alicedb")
    # The traps are real: an ordinary superuser session in the tenant's database becomes the tenant and
    # resolves through the planted path.
    with s.connect("alicedb") as conn:
        assert conn.execute("SELECT current_user").fetchone() == (TENANT,)
        conn.execute("SELECT pg_get_userbyid(10)")
    assert s.calls("alicedb") == [("pg_get_userbyid", SUPERUSER)]
    with s.connect("alicedb") as conn:
        conn.execute("TRUNCATE evil.calls")
    before = len(s.authorized())

    seen = observed(s.read_back(declared("alicedb")))
    connections = s.authorized()[before:]

    # It read what it must: the tenant's schema (owned by the tenant), the extensions.
    db = seen.databases["alicedb"]
    assert db.schemas == {"sales": TENANT} and db.extensions == frozenset({"plpgsql"})
    assert db.owner == TENANT and seen.roles[TENANT].login
    # Nothing planted ran, and the tenant's database was entered as the monitoring role only.
    assert s.calls("alicedb") == []
    entered = [who for who, where in connections if where == "alicedb"]
    assert entered == [MONITOR_ROLE], f"the read-back entered the tenant's database as {entered}"


def test_a_database_that_locks_the_read_role_out_is_reported_not_read_as_the_superuser(
    server: Server,
) -> None:
    s = server
    for db in ("alicedb", "bobdb", "caroldb"):
        s.tenant_database(db)
    s.as_tenant("alicedb", 'REVOKE CONNECT ON DATABASE "alicedb" FROM PUBLIC')
    s.as_tenant("caroldb", 'ALTER DATABASE "caroldb" CONNECTION LIMIT 0')
    before = len(s.authorized())
    cluster = declared("alicedb", "bobdb", "caroldb")

    seen = observed(s.read_back(cluster))
    connections = s.authorized()[before:]

    plan = converge(cluster, seen, Passwords())
    entries = {e.name: e for e in plan.databases}
    for db in ("alicedb", "caroldb"):
        assert not entries[db].applied, f"{db} was reported applied"
        assert MONITOR_ROLE in entries[db].reason, entries[db].reason
        # Nothing is planned inside a database that was not read.
        assert f"\\connect {db}\n" not in plan.sql
    assert entries["bobdb"].applied, entries["bobdb"].reason
    assert seen.databases["bobdb"].schemas == {"sales": TENANT}
    entered = [(who, where) for who, where in connections if where != "postgres"]
    assert entered == [(MONITOR_ROLE, "bobdb")], entered
    assert s.calls("alicedb") == s.calls("bobdb") == s.calls("caroldb") == []


def test_an_instance_on_an_older_image_is_read_as_before_and_says_so(older_server: Server) -> None:
    s = older_server
    s.tenant_database("alicedb")
    before = len(s.authorized())

    seen = observed(s.read_back(declared("alicedb")))
    connections = s.authorized()[before:]

    assert seen.databases["alicedb"].schemas == {"sales": TENANT}
    assert s.calls("alicedb") == []
    entered = [who for who, where in connections if where == "alicedb"]
    assert entered == [SUPERUSER]
    assert seen.databases_read_as == SUPERUSER  # the sub-reconciler logs it


def test_a_database_that_refuses_the_read_role_at_login_is_read_last_next_time(server: Server) -> None:
    """CONNECT granted and a limit above zero, but the tenant holds every connection its limit allows: the
    refusal comes only at login, where psql stops. The database is reported with the server's reason, the
    ones after it as not read this time; the next check reads it last, so the others are read."""
    s = server
    for db in ("alicedb", "bobdb"):
        s.tenant_database(db)
    s.as_tenant("alicedb", 'ALTER DATABASE "alicedb" CONNECTION LIMIT 1')
    cluster = declared("alicedb", "bobdb")
    # The tenant's own session (it logs in over TCP with its password in a pod; here the one connection
    # the socket admits stands for it: every backend in the database counts towards its limit).
    with s.connect("alicedb"):
        before = len(s.authorized())
        result = s.read_back(cluster)
        assert result.returncode != 0  # psql ended at the refused \connect
        seen = role_reads.observed_of(result.returncode, result.stdout, result.stderr)
        assert seen is not None and seen.stopped_at == "alicedb"
        alice, bob = seen.databases["alicedb"], seen.databases["bobdb"]
        assert alice.unread is not None and 'too many connections for database "alicedb"' in alice.unread
        assert bob.unread == "not read this time: the read stopped at database alicedb"
        entries = {e.name: e for e in converge(cluster, seen, Passwords()).databases}
        assert not entries["alicedb"].applied and not entries["bobdb"].applied

        seen = role_reads.parse_observed(*_out(s.read_back(cluster, read_last=("alicedb", "bobdb"))))
        assert seen.stopped_at == "alicedb" and seen.databases["bobdb"].unread is not None  # same order
        seen = role_reads.parse_observed(*_out(s.read_back(cluster, read_last=("alicedb",))))
        assert seen.databases["bobdb"].schemas == {"sales": TENANT} and seen.databases["bobdb"].unread is None
        assert seen.databases["alicedb"].unread is not None
    connections = s.authorized()[before:]
    assert {who for who, where in connections if where != "postgres"} == {MONITOR_ROLE}


def _out(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    return result.stdout, result.stderr
