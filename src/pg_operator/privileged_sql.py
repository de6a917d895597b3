"""How a privileged session (the superuser's, over the instance's Unix socket) is opened so that nothing a
tenant controls is resolved or applied in it. A leaf: imports nothing of pg_operator.

A tenant owns the databases declared for it, owns `public` in them (PostgreSQL 15+) and may
`ALTER DATABASE … SET` any user-settable parameter there: `search_path` (so an unqualified function,
operator or table name resolves to the tenant's object, which then runs as the superuser), `role` (so the
superuser's session acts as the tenant), `default_transaction_read_only` (so every write fails). Options
in the startup packet outrank the database's settings, and they hold for every connection of the process
(psql's `\\connect` included), so the session's argv carries them in `PGOPTIONS`; the SQL a script sends
sets them again after each connection, so a script run any other way is pinned too. Names the scripts call
are schema-qualified besides; operators resolve through the pinned path (`pg_temp` is never searched for
functions or operators, and only this session can create objects in it).
"""

from __future__ import annotations

# The search path alone, as a startup option: what the instance's own sessions pin (instance/session_roles).
PINNED_SEARCH_PATH = "--search_path=pg_catalog,pg_temp"
# Startup options of every privileged session (backend syntax: `--name=value`, separated by spaces).
PINNED_OPTIONS = f"{PINNED_SEARCH_PATH} --role=none --default_transaction_read_only=off"
# The same, as statements: first in every script and after each `\connect`.
PINNED_SQL = (
    "SET ROLE NONE;\nSET search_path = pg_catalog, pg_temp;\nSET default_transaction_read_only = off;\n"
)
# The same for a session of an unprivileged role (the roles read-back inside the databases a tenant owns):
# only what any role may set, and string literals read as the scripts quote them.
READ_SQL = PINNED_SQL + "SET standard_conforming_strings = on;\n"
# A script that sends passwords' verifiers keeps its statements out of every server log, whatever the
# user configured (a verifier is not the password, but it is what an attacker would grind offline).
QUIET_SQL = (
    PINNED_SQL + "SET standard_conforming_strings = on;\n"
    "SET log_statement = 'none';\n"
    "SET log_min_duration_statement = -1;\n"
    "SET log_min_error_statement = 'panic';\n"
)


def pinned_env() -> dict[str, str]:
    """The environment a privileged psql or libpq client runs with."""
    return {"PGOPTIONS": PINNED_OPTIONS}
