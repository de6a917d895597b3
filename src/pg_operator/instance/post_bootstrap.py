"""Run once by Patroni after the cluster's data is created (initdb, or a restore from another cluster's
backup): make the application owner and database match Secret <name>-app and instance.yaml.

Patroni 4 has no bootstrap.users; it calls `bootstrap.post_bootstrap` with a superuser connection string
(password in PGPASSFILE, never on the command line). It resets the superuser's and the replication
role's passwords itself; the application owner's is ours to set. After a restore the catalog is the
source's: the owner may exist with the source's password (it gets this cluster's), and the database may
exist with its data (it is kept as it is, owner included; only a missing one is created, empty).

The restored catalog is the source's too, tenants' objects and settings included (a database's
`search_path`, functions and operators in schemas they own): this superuser session pins its search path
in the startup packet (session_roles) and qualifies the catalog names it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pg_operator.instance.inputs import Credentials
from pg_operator.instance.session_roles import ensure_monitor_role_in
from pg_operator.privileged_sql import PINNED_SEARCH_PATH
from pg_operator.scram import scram_sha256_verifier

# Keep the role statements out of every log, whatever the user configured.
_QUIET = (
    "SET log_statement = 'none'",
    "SET log_min_duration_statement = -1",
    "SET log_min_error_statement = 'panic'",
)


@dataclass(frozen=True)
class Outcome:
    """What was done, for the entrypoint's log line (no secrets)."""

    role_created: bool
    database_created: bool

    def describe(self, owner: str, database: str) -> str:
        role = f"created role {owner}" if self.role_created else f"set the password of role {owner}"
        db = f"created database {database}" if self.database_created else f"kept database {database}"
        return f"{role}; {db}"


def create_app_owner_and_database(
    dsn: str, owner: Credentials, database: str, *, restored: bool = False
) -> Outcome:
    """Create or update the owner (LOGIN, this cluster's password) and create the database if missing.
    An existing database is given to the owner after initdb (it can only be a retried bootstrap's), but
    left as restored after a restore: its owner and privileges are the source's data."""
    verifier = scram_sha256_verifier(owner.password)
    with psycopg.connect(dsn, autocommit=True, options=PINNED_SEARCH_PATH) as conn:
        for statement in _QUIET:
            conn.execute(statement)
        role = sql.Identifier(owner.username)
        exists = conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (owner.username,))
        role_created = exists.fetchone() is None
        verb = sql.SQL("CREATE") if role_created else sql.SQL("ALTER")
        conn.execute(sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, role, sql.Literal(verifier)))
        has_db = conn.execute("SELECT 1 FROM pg_catalog.pg_database WHERE datname = %s", (database,))
        database_created = has_db.fetchone() is None
        if database_created:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), role))
        elif not restored:
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(database), role))
        # The role of the archive reporter and /metrics (docs/monitoring.md).
        ensure_monitor_role_in(conn)
    return Outcome(role_created=role_created, database_created=database_created)
