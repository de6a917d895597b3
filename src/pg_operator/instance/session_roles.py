"""How the instance's own sessions connect: each as the least-privileged role that suffices, every one with
its search path pinned.

Tenants own databases and their `public` schemas and may `ALTER DATABASE … SET search_path` (or, with
`createrole` on an old major, `ALTER ROLE … SET`): a session that resolved names through such a path
would run the tenant's functions and operators with its own rights. So every session opened here passes
`search_path=pg_catalog,pg_temp` in its startup packet, which outranks the database's and the role's
settings from the first statement on (and `pg_temp` last keeps temporary objects from shadowing
anything).

The archive reporter and the /metrics server log in directly as `pgop_monitor` (a member of
`pg_monitor`), over the Unix socket through a peer map of its own (patroni_config.pg_hba), never as the
superuser: a session that switched roles with `SET SESSION AUTHORIZATION` would stay one `RESET` away
from it. The role is created at bootstrap (post_bootstrap) and, for clusters bootstrapped before it
existed, by `keep_monitor_role` on the primary: the only superuser session this module opens, short-lived
and pinned like the others.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.instance.patroni_config import MONITOR_DATABASE
from pg_operator.privileged_sql import PINNED_SEARCH_PATH

CONNECT_TIMEOUT_SECONDS = 5
# How often the role keeper tries while PostgreSQL is not up yet or is a standby.
KEEPER_RETRY_SECONDS = 5.0


def _log(message: str) -> None:
    print(f"pg-operator-instance roles: {message}", file=sys.stderr, flush=True)


def connect(*, socket_dir: str, pg_port: int, user: str, dbname: str = MONITOR_DATABASE,
            **kwargs: Any) -> psycopg.Connection[Any]:  # fmt: skip
    """A session over the Unix socket with the search path pinned."""
    return psycopg.connect(host=socket_dir, port=pg_port, dbname=dbname, user=user,
                           connect_timeout=CONNECT_TIMEOUT_SECONDS, options=PINNED_SEARCH_PATH,
                           **kwargs)  # fmt: skip


def monitor_role_statements(role: str = MONITOR_ROLE) -> list[sql.Composed]:
    """The monitoring role: it logs in only through its peer map on the socket (it has no password, and
    pg_hba rejects it over TCP) and reads statistics as pg_monitor does, nothing more."""
    ident = sql.Identifier(role)
    return [
        sql.SQL(
            "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
            "CONNECTION LIMIT 5"
        ).format(ident),
        sql.SQL("GRANT pg_monitor TO {}").format(ident),
    ]


def ensure_monitor_role_in(conn: psycopg.Connection[Any], role: str = MONITOR_ROLE) -> bool:
    """In a superuser session whose search path is pinned: create the role when missing. True if it was
    created."""
    row = conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (role,)).fetchone()
    if row is not None:
        return False
    for statement in monitor_role_statements(role):
        conn.execute(statement)
    return True


def ensure_monitor_role(*, socket_dir: str, pg_port: int, superuser: str) -> bool:
    """True once the monitoring role exists here: found, or created on a primary. False on a standby
    that has not received it yet (its primary creates it; replication brings it)."""
    with connect(socket_dir=socket_dir, pg_port=pg_port, user=superuser, autocommit=True,
                 application_name="pg-operator-roles") as conn:  # fmt: skip
        found = conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (MONITOR_ROLE,))
        if found.fetchone() is not None:
            return True
        in_recovery = conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone()
        if in_recovery is None or in_recovery[0]:
            return False
        if ensure_monitor_role_in(conn):
            _log(f"created role {MONITOR_ROLE} (member of pg_monitor)")
        return True


def keep_monitor_role(*, socket_dir: str, pg_port: int, superuser: str) -> None:
    """Try until the role exists (PostgreSQL may not be up yet, or this may be a standby); then stop, so
    no superuser session stays open."""
    logged = False
    while True:
        try:
            if ensure_monitor_role(socket_dir=socket_dir, pg_port=pg_port, superuser=superuser):
                return
        except psycopg.Error as e:
            if not logged:
                message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                _log(f"cannot check role {MONITOR_ROLE} yet (retrying): {message}")
                logged = True
        time.sleep(KEEPER_RETRY_SECONDS)


def start_keeper(*, socket_dir: str, pg_port: int, superuser: str) -> threading.Thread:
    thread = threading.Thread(
        target=keep_monitor_role,
        name="monitor-role",
        daemon=True,
        kwargs={"socket_dir": socket_dir, "pg_port": pg_port, "superuser": superuser},
    )
    thread.start()
    return thread
