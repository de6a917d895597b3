"""The pooler pod's /metrics, on pgbouncer_exporter's names (so its dashboards and alerts work): the
console's SHOW POOLS and SHOW STATS rows turned into Prometheus text. Pure: rows in, text out.

Ours beside them: `pg_operator_pooler_paused` (1 while PgBouncer is paused) and
`pg_operator_pooler_target_info{host}` (where it points).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

Row = Mapping[str, str | None]

# SHOW POOLS column → (metric, help); one sample per database and user.
POOL_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "cl_active",
        "pgbouncer_pools_client_active_connections",
        "Client connections linked to a server connection and able to process queries",
    ),
    (
        "cl_waiting",
        "pgbouncer_pools_client_waiting_connections",
        "Client connections waiting on a server connection",
    ),
    (
        "sv_active",
        "pgbouncer_pools_server_active_connections",
        "Server connections linked to a client connection",
    ),
    (
        "sv_idle",
        "pgbouncer_pools_server_idle_connections",
        "Server connections idle and ready for a client query",
    ),
    (
        "sv_used",
        "pgbouncer_pools_server_used_connections",
        "Server connections idle more than server_check_delay, needing a check",
    ),
    (
        "sv_login",
        "pgbouncer_pools_server_login_connections",
        "Server connections currently in the process of logging in",
    ),
)
# SHOW STATS column → (metric, help, divisor); counters per database.
STAT_COUNTERS: tuple[tuple[str, str, str, float], ...] = (
    (
        "total_xact_count",
        "pgbouncer_stats_sql_transactions_pooled_total",
        "Total number of SQL transactions pooled",
        1.0,
    ),
    ("total_query_count", "pgbouncer_stats_queries_pooled_total", "Total number of SQL queries pooled", 1.0),
    (
        "total_received",
        "pgbouncer_stats_received_bytes_total",
        "Total volume in bytes of network traffic received by pgbouncer",
        1.0,
    ),
    (
        "total_sent",
        "pgbouncer_stats_sent_bytes_total",
        "Total volume in bytes of network traffic sent by pgbouncer",
        1.0,
    ),
    (
        "total_xact_time",
        "pgbouncer_stats_server_in_transaction_seconds_total",
        "Total number of seconds spent by pgbouncer when connected to PostgreSQL in a transaction",
        1e6,
    ),
    (
        "total_query_time",
        "pgbouncer_stats_queries_duration_seconds_total",
        "Total number of seconds spent by pgbouncer when actively connected to PostgreSQL",
        1e6,
    ),
    (
        "total_wait_time",
        "pgbouncer_stats_client_wait_seconds_total",
        "Time spent by clients waiting for a server in seconds",
        1e6,
    ),
    # Protocol-level prepared statements (PgBouncer 1.21+; absent columns give no samples): the clients'
    # Parse messages, the ones PgBouncer sent to a server (a first use, or again on a new server
    # connection: after a switchover), and the Bind messages.
    (
        "total_client_parse_count",
        "pgbouncer_stats_client_parses_total",
        "Total number of prepared statements created by clients",
        1.0,
    ),
    (
        "total_server_parse_count",
        "pgbouncer_stats_server_parses_total",
        "Total number of prepared statements created by pgbouncer on a server",
        1.0,
    ),
    (
        "total_bind_count",
        "pgbouncer_stats_binds_total",
        "Total number of prepared statements readied for execution by clients and forwarded to a server",
        1.0,
    ),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


def _pool(row: Row) -> str:
    return _labels((("database", str(row.get("database") or "")), ("user", str(row.get("user") or ""))))


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _fmt(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def render(*, up: bool, pools: Sequence[Row] = (), stats: Sequence[Row] = (), paused: bool = False,
           target: str = "") -> str:  # fmt: skip
    out = ["# HELP pgbouncer_up The pgbouncer scrape succeeded", "# TYPE pgbouncer_up gauge",
           f"pgbouncer_up {1 if up else 0}"]  # fmt: skip
    for column, metric, text in POOL_GAUGES:
        samples = []
        for row in pools:
            value = _number(row.get(column))
            if value is None:
                continue
            samples.append(f"{metric}{_pool(row)} {_fmt(value)}")
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge", *samples]
    maxwait = []
    for row in pools:
        seconds, micros = _number(row.get("maxwait")), _number(row.get("maxwait_us"))
        if seconds is None:
            continue
        wait = seconds + (micros or 0) / 1e6
        maxwait.append(f"pgbouncer_pools_client_maxwait_seconds{_pool(row)} {_fmt(wait)}")
    out += ["# HELP pgbouncer_pools_client_maxwait_seconds Age of the oldest unserved client connection",
            "# TYPE pgbouncer_pools_client_maxwait_seconds gauge", *maxwait]  # fmt: skip
    for column, metric, text, divisor in STAT_COUNTERS:
        samples = []
        for row in stats:
            value = _number(row.get(column))
            if value is None:
                continue
            samples.append(f"{metric}{_labels([('database', str(row.get('database') or ''))])} "
                           f"{_fmt(value / divisor)}")  # fmt: skip
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} counter", *samples]
    out += [
        "# HELP pg_operator_pooler_paused 1 while PgBouncer is paused (around a switchover)",
        "# TYPE pg_operator_pooler_paused gauge",
        f"pg_operator_pooler_paused {1 if paused else 0}",
    ]
    if target:
        out += [
            "# HELP pg_operator_pooler_target_info The host the pooler sends server connections to",
            "# TYPE pg_operator_pooler_target_info gauge",
            f"pg_operator_pooler_target_info{_labels([('host', target)])} 1",
        ]
    return "\n".join(out) + "\n"
