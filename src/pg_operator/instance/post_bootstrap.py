"""Run once by Patroni after initdb on the first primary: create the application owner and database.

Patroni 4 has no bootstrap.users; it calls `bootstrap.post_bootstrap` with a superuser connection string
(password in PGPASSFILE, never on the command line).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pg_operator.instance.inputs import Credentials
from pg_operator.instance.scram import scram_sha256_verifier

# Keep the role statements out of every log, whatever the user configured.
_QUIET = (
    "SET log_statement = 'none'",
    "SET log_min_duration_statement = -1",
    "SET log_min_error_statement = 'panic'",
)


def create_app_owner_and_database(dsn: str, owner: Credentials, database: str) -> None:
    verifier = scram_sha256_verifier(owner.password)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in _QUIET:
            conn.execute(statement)
        role = sql.Identifier(owner.username)
        exists = conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (owner.username,))
        verb = sql.SQL("ALTER") if exists.fetchone() else sql.SQL("CREATE")
        conn.execute(sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, role, sql.Literal(verifier)))
        has_db = conn.execute("SELECT 1 FROM pg_catalog.pg_database WHERE datname = %s", (database,))
        if not has_db.fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), role))
        else:
            conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(sql.Identifier(database), role))
