"""The pooler pod's /metrics text on pgbouncer_exporter's names."""

from __future__ import annotations

from pg_operator.pooler.metrics import render

POOLS = [
    {
        "database": "app",
        "user": "app",
        "cl_active": "4",
        "cl_waiting": "2",
        "sv_active": "3",
        "sv_idle": "1",
        "sv_used": "0",
        "sv_login": "0",
        "maxwait": "1",
        "maxwait_us": "500000",
    }
]
STATS = [
    {
        "database": "app",
        "total_xact_count": "120",
        "total_query_count": "240",
        "total_received": "1000",
        "total_sent": "2000",
        "total_xact_time": "1500000",
        "total_query_time": "500000",
        "total_wait_time": "250000",
    }
]


def samples(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_pools_and_stats_by_exporter_names() -> None:
    got = samples(render(up=True, pools=POOLS, stats=STATS, paused=True, target="db-0.db.shop.svc"))
    pool = '{database="app",user="app"}'
    assert got["pgbouncer_up"] == "1"
    assert got[f"pgbouncer_pools_client_active_connections{pool}"] == "4"
    assert got[f"pgbouncer_pools_client_waiting_connections{pool}"] == "2"
    assert got[f"pgbouncer_pools_server_active_connections{pool}"] == "3"
    assert got[f"pgbouncer_pools_server_idle_connections{pool}"] == "1"
    assert got[f"pgbouncer_pools_client_maxwait_seconds{pool}"] == "1.5"
    assert got['pgbouncer_stats_sql_transactions_pooled_total{database="app"}'] == "120"
    assert got['pgbouncer_stats_queries_pooled_total{database="app"}'] == "240"
    assert got['pgbouncer_stats_server_in_transaction_seconds_total{database="app"}'] == "1.5"
    assert got['pgbouncer_stats_client_wait_seconds_total{database="app"}'] == "0.25"
    assert got["pg_operator_pooler_paused"] == "1"
    assert got['pg_operator_pooler_target_info{host="db-0.db.shop.svc"}'] == "1"


def test_prepared_statement_counters_when_pgbouncer_has_them() -> None:
    newer = [{**STATS[0], "total_client_parse_count": "9", "total_server_parse_count": "4",
              "total_bind_count": "300"}]  # fmt: skip
    got = samples(render(up=True, stats=newer))
    assert got['pgbouncer_stats_client_parses_total{database="app"}'] == "9"
    assert got['pgbouncer_stats_server_parses_total{database="app"}'] == "4"
    assert got['pgbouncer_stats_binds_total{database="app"}'] == "300"
    # A PgBouncer before 1.21 has no such columns: no samples, and nothing else breaks.
    older = samples(render(up=True, stats=STATS))
    assert not any(k.startswith("pgbouncer_stats_client_parses_total") for k in older)
    assert older['pgbouncer_stats_sql_transactions_pooled_total{database="app"}'] == "120"


def test_down_says_so_and_nothing_else_of_pools() -> None:
    got = samples(render(up=False))
    assert got == {"pgbouncer_up": "0", "pg_operator_pooler_paused": "0"}


def test_labels_are_escaped_and_bad_numbers_skipped() -> None:
    text = render(up=True, pools=[{"database": 'we"ird\\', "user": "u", "cl_active": "x", "cl_waiting": "1"}])
    got = samples(text)
    assert 'pgbouncer_pools_client_waiting_connections{database="we\\"ird\\\\",user="u"}' in got
    assert not any(k.startswith("pgbouncer_pools_client_active_connections") for k in got)
