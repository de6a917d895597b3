"""The instance's own sessions, their pure parts: the pinned search path and the monitoring role's SQL."""

from __future__ import annotations

from pathlib import Path

from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.instance import archive_reporter, session_roles
from pg_operator.privileged_sql import PINNED_OPTIONS, PINNED_SEARCH_PATH


def test_every_session_pins_the_search_path_to_the_catalog_then_temp() -> None:
    # libpq splits `options` at whitespace: one --name=value setting, no spaces inside it. The same option
    # the operator's own privileged sessions start with.
    assert PINNED_SEARCH_PATH.split() == ["--search_path=pg_catalog,pg_temp"]
    assert PINNED_OPTIONS.split()[0] == PINNED_SEARCH_PATH


def test_the_monitoring_role_is_created_with_least_privilege() -> None:
    statements = [s.as_string(None) for s in session_roles.monitor_role_statements()]
    assert statements == [
        f'CREATE ROLE "{MONITOR_ROLE}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS '
        "CONNECTION LIMIT 5",
        f'GRANT pg_monitor TO "{MONITOR_ROLE}"',
    ]
    assert not any("PASSWORD" in s or "SUPERUSER " in s.replace("NOSUPERUSER", "") for s in statements)


def test_the_archive_reporter_qualifies_the_functions_it_calls() -> None:
    sql = archive_reporter.ARCHIVES_SQL
    assert "pg_catalog.pg_is_in_recovery()" in sql and "pg_catalog.current_setting(" in sql
    assert "SESSION AUTHORIZATION" not in Path(archive_reporter.__file__).read_text()
