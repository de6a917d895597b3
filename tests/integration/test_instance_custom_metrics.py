"""The tenant's custom queries on a real PostgreSQL: served next to the built-in set as the monitoring
role; a query that fails (syntax, a missing table, a wrong column, a timeout) or a refused file costs its
own samples and is counted, never the scrape; a query cannot leave a setting behind in the /metrics
session (the attack: set_config('statement_timeout', '0', false) would lift the timeout of every later
scrape)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.local_postgres import Postgres, postgresql_16, run_user
from harness.net import free_port
from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.instance import metrics_server

QUERIES = """
pg_app_identity:
  query: "SELECT current_user AS role, current_setting('statement_timeout') AS timeout,
          current_setting('search_path') AS path, 1 AS up"
  metrics:
    - role: {usage: LABEL, description: "who runs the query"}
    - timeout: {usage: LABEL, description: "the statement timeout it runs under"}
    - path: {usage: LABEL, description: "the search path it runs under"}
    - up: {usage: GAUGE, description: "always 1"}
pg_app_leak:
  query: "SELECT set_config('statement_timeout', '0', false) AS was,
          set_config('search_path', 'public', false) AS path, 1 AS v"
  metrics:
    - was: {usage: DISCARD}
    - path: {usage: DISCARD}
    - v: {usage: GAUGE, description: "tries to lift the session's timeout and move its search path"}
pg_app_syntax:
  query: "SELEC 1 AS v"
  metrics: [{v: {usage: GAUGE}}]
pg_app_missing:
  query: "SELECT count(*) AS v FROM no_such_table"
  metrics: [{v: {usage: GAUGE}}]
pg_app_column:
  query: "SELECT 1 AS other"
  metrics: [{v: {usage: GAUGE}}]
pg_app_slow:
  query: "SELECT 1 AS v FROM pg_sleep(30)"
  metrics: [{v: {usage: GAUGE}}]
pg_app_orders:
  query: "SELECT count(*) AS rows FROM public.orders"
  database: shop
  metrics: [{rows: {usage: GAUGE, description: "rows of a table in another database"}}]
pg_app_write:
  query: "CREATE TABLE pgop_custom_write AS SELECT 1 AS v"
  metrics: [{v: {usage: GAUGE}}]
"""


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    # Not under pytest's temporary directory: PostgreSQL's user must reach its data directory.
    work = Path(tempfile.mkdtemp(prefix="pgop-custom-metrics-it-", dir="/var/tmp"))
    work.chmod(0o755)
    pg_home = postgresql_16()
    env = {
        "PATH": f"{pg_home / 'bin'}:/usr/bin:/bin",
        "LD_LIBRARY_PATH": str(pg_home / "lib"),
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
    }
    pg = Postgres("custom", work / "custom" / "pgdata", free_port(), pg_home, run_user(), env)
    pg.initdb()
    pg.configure(pg.base_parameters())
    pg.start()
    pg.query(f'CREATE ROLE "{MONITOR_ROLE}" LOGIN IN ROLE pg_monitor')
    pg.query("CREATE DATABASE shop")
    with pg.connect("shop") as conn:
        conn.execute("CREATE TABLE public.orders AS SELECT generate_series(1, 3) AS id")
        conn.execute(f'GRANT SELECT ON public.orders TO "{MONITOR_ROLE}"')
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


def collector(pg: Postgres, path: Path) -> metrics_server.Collector:
    return metrics_server.Collector(
        socket_dir=str(pg.socket_dir), port=pg.port, login_user=MONITOR_ROLE, custom_file=str(path)
    )


def test_custom_queries_run_as_the_monitoring_role_and_failures_never_break_the_scrape(
    postgres: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_server, "STATEMENT_TIMEOUT_MS", 700)  # the slow query's timeout, sooner
    path = tmp_path / "queries.yaml"
    path.write_text(QUERIES)
    c = collector(postgres, path)
    for _ in range(2):  # the second scrape runs after the leak attempt, on the same session
        text = c.collect()
        assert "\npg_up 1\n" in text, c.last_error
        assert "pg_stat_database_xact_commit_total" in text or "pg_settings_max_connections" in text
        labels = f'role="{MONITOR_ROLE}",timeout="700ms",path="pg_catalog,pg_temp"'
        assert f"pg_app_identity_up{{{labels}}} 1" in text, text
        assert "pg_app_leak_v 1" in text  # it ran; what it set did not outlive it
    for failing in ("syntax", "missing", "column", "slow", "write"):
        assert f'pgop_custom_query_errors_total{{query="pg_app_{failing}"}} 2' in text, failing
        assert f"pg_app_{failing}_v " not in text
    assert "pg_app_orders_rows 3" in text  # from database shop, on a connection kept between scrapes
    assert "pgop_custom_queries 8" in text and "pgop_custom_queries_invalid 0" in text
    assert postgres.query("SELECT to_regclass('pgop_custom_write')") == [(None,)]


def test_a_refused_file_serves_the_built_in_set_and_a_fixed_one_is_read_again(
    postgres: Postgres, tmp_path: Path
) -> None:
    path = tmp_path / "queries.yaml"
    c = collector(postgres, path)
    text = c.collect()  # no file yet (the ConfigMap does not exist): the built-in set alone
    assert "\npg_up 1\n" in text and "pgop_custom_queries 0" in text
    path.write_text("pg_up:\n  query: SELECT 1 AS v\n  metrics: [{v: {usage: HISTOGRAM}}]\n")
    text = c.collect()
    assert "\npg_up 1\n" in text and "pgop_custom_queries_invalid 1" in text
    path.write_text("pg_app:\n  query: SELECT 42 AS answer\n  metrics: [{answer: {usage: GAUGE}}]\n")
    text = c.collect()
    assert "pg_app_answer 42" in text and "pgop_custom_queries_invalid 0" in text
