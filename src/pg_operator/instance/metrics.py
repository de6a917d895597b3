"""What an instance's /metrics holds: the SQL it runs, the samples made from the rows, and Prometheus'
text exposition format. Pure: no connection, no I/O (the server is metrics_server.py).

Names follow postgres_exporter's `pg_*` conventions so that existing dashboards and alerts read them
(docs/monitoring.md lists every family). The queries read only statistics views and settings that the
`pg_monitor` role may read; every one is a single pass over a small catalog, so a scrape stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Connection states pg_stat_activity reports; each database gets a zero for the ones it has none of, so
# a rate or a comparison never meets a missing series.
ACTIVITY_STATES = (
    "active",
    "idle",
    "idle in transaction",
    "idle in transaction (aborted)",
    "fastpath function call",
    "disabled",
)

# --- SQL ---------------------------------------------------------------------------------------------
# Each query is named by what it feeds. Client backends only (not walsenders or background workers), and
# never the exporter's own session.

INSTANCE_SQL = """
SELECT current_setting('server_version_num')::int AS version_num,
       current_setting('server_version') AS version,
       current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS superuser_reserved_connections,
       pg_is_in_recovery() AS in_recovery,
       CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE GREATEST(0, EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())) END AS lag_seconds,
       (SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming') AS wal_receivers_streaming,
       EXTRACT(EPOCH FROM pg_postmaster_start_time()) AS start_time,
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') END AS wal_lsn
"""

ACTIVITY_SQL = """
SELECT datname, state, count(*) AS connections,
       COALESCE(max(EXTRACT(EPOCH FROM now() - xact_start)), 0) AS max_tx_seconds
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() AND datname IS NOT NULL
GROUP BY datname, state
"""

DATABASE_SQL = """
SELECT d.datname, s.xact_commit, s.xact_rollback, s.deadlocks, s.conflicts,
       s.blks_read, s.blks_hit, s.tup_returned, s.tup_fetched, s.tup_inserted, s.tup_updated,
       s.tup_deleted, s.temp_bytes,
       age(d.datfrozenxid) AS age_datfrozenxid, mxid_age(d.datminmxid) AS age_datminmxid
FROM pg_database d JOIN pg_stat_database s ON s.datid = d.oid
WHERE d.datallowconn AND NOT d.datistemplate
"""

# pg_database_size() walks every file of a database: most of a scrape's cost (184 of 226 ms for 100
# databases on a 2-core machine), for a figure that moves slowly. It runs at most once a minute; scrapes
# in between serve the last sizes.
SIZES_SQL = """
SELECT datname, pg_database_size(oid) AS size_bytes
FROM pg_database WHERE datallowconn AND NOT datistemplate
"""
SIZES_MAX_AGE_SECONDS = 60.0

LOCKS_SQL = """
SELECT d.datname, l.mode, count(*) FILTER (WHERE l.granted) AS granted,
       count(*) FILTER (WHERE NOT l.granted) AS waiting
FROM pg_locks l JOIN pg_database d ON d.oid = l.database
GROUP BY d.datname, l.mode
"""

REPLICATION_SQL = """
SELECT application_name, COALESCE(host(client_addr), '') AS client_addr, state,
       COALESCE(slot.slot_name, '') AS slot_name,
       CASE WHEN pg_is_in_recovery() THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn) END AS lag_bytes,
       EXTRACT(EPOCH FROM r.replay_lag) AS replay_lag_seconds,
       EXTRACT(EPOCH FROM r.write_lag) AS write_lag_seconds,
       EXTRACT(EPOCH FROM r.flush_lag) AS flush_lag_seconds
FROM pg_stat_replication r LEFT JOIN pg_replication_slots slot ON slot.active_pid = r.pid
"""

ARCHIVER_SQL = """
SELECT archived_count, failed_count,
       EXTRACT(EPOCH FROM now() - last_archived_time) AS last_archive_age,
       EXTRACT(EPOCH FROM now() - last_failed_time) AS last_failed_age,
       last_failed_time IS NOT NULL AND (last_archived_time IS NULL OR last_failed_time > last_archived_time)
         AS failing
FROM pg_stat_archiver
"""

# PostgreSQL 17 moved the checkpoint counters to pg_stat_checkpointer.
CHECKPOINTS_SQL_BEFORE_17 = """
SELECT checkpoints_timed AS timed, checkpoints_req AS requested,
       checkpoint_write_time / 1000.0 AS write_seconds, checkpoint_sync_time / 1000.0 AS sync_seconds,
       buffers_checkpoint AS buffers
FROM pg_stat_bgwriter
"""
CHECKPOINTS_SQL_FROM_17 = """
SELECT num_timed AS timed, num_requested AS requested,
       write_time / 1000.0 AS write_seconds, sync_time / 1000.0 AS sync_seconds,
       buffers_written AS buffers
FROM pg_stat_checkpointer
"""


def checkpoints_sql(version_num: int) -> str:
    return CHECKPOINTS_SQL_FROM_17 if version_num >= 170000 else CHECKPOINTS_SQL_BEFORE_17


# --- samples -----------------------------------------------------------------------------------------

# Every family this endpoint may serve: name -> (type, help). The contract with the alerts and the
# dashboard (deploy/monitoring/); docs/monitoring.md lists it too.
CATALOG: dict[str, tuple[str, str]] = {
    "pg_up": ("gauge", "1 when PostgreSQL answered this scrape's queries."),
    "pg_static": ("gauge", "Version of the PostgreSQL server (value 1)."),
    "pg_settings_max_connections": ("gauge", "max_connections."),
    "pg_settings_superuser_reserved_connections": ("gauge", "superuser_reserved_connections."),
    "pg_replication_is_replica": ("gauge", "1 on a standby (in recovery), 0 on the primary."),
    "pg_replication_lag_seconds": (
        "gauge",
        "On a standby: seconds since the last replayed transaction, 0 when it replayed all it received.",
    ),
    "pg_stat_wal_receiver_streaming": ("gauge", "On a standby: 1 while its WAL receiver streams."),
    "pg_postmaster_start_time_seconds": ("gauge", "When PostgreSQL started (Unix time)."),
    "pg_wal_lsn_bytes": ("gauge", "On the primary: the current WAL position in bytes (its rate: WAL/s)."),
    "pg_stat_activity_count": ("gauge", "Client connections by database and state."),
    "pg_stat_activity_max_tx_duration": (
        "gauge",
        "Age in seconds of the oldest open transaction, by database and state.",
    ),
    "pg_stat_database_xact_commit": ("counter", "Transactions committed."),
    "pg_stat_database_xact_rollback": ("counter", "Transactions rolled back."),
    "pg_stat_database_deadlocks": ("counter", "Deadlocks detected."),
    "pg_stat_database_conflicts": ("counter", "Queries cancelled by recovery conflicts (standbys)."),
    "pg_stat_database_blks_read": ("counter", "Disk blocks read."),
    "pg_stat_database_blks_hit": ("counter", "Disk blocks found in shared buffers."),
    "pg_stat_database_tup_returned": ("counter", "Rows returned by queries."),
    "pg_stat_database_tup_fetched": ("counter", "Rows fetched by queries."),
    "pg_stat_database_tup_inserted": ("counter", "Rows inserted."),
    "pg_stat_database_tup_updated": ("counter", "Rows updated."),
    "pg_stat_database_tup_deleted": ("counter", "Rows deleted."),
    "pg_stat_database_temp_bytes": ("counter", "Bytes written to temporary files."),
    "pg_database_size_bytes": ("gauge", "Disk space used by the database (read at most once a minute)."),
    "pg_database_wraparound_age_datfrozenxid": (
        "gauge",
        "Transaction IDs since the database was last frozen (wraparound at 2^31).",
    ),
    "pg_database_wraparound_age_datminmxid": ("gauge", "Multixact IDs since the database's oldest one."),
    "pg_locks_count": ("gauge", "Granted locks by database and mode."),
    "pg_locks_waiting": ("gauge", "Lock requests waiting to be granted, by database."),
    "pg_stat_replication_pg_wal_lsn_diff": (
        "gauge",
        "On the primary, per standby: bytes of WAL the standby has not replayed yet.",
    ),
    "pg_stat_replication_write_lag_seconds": (
        "gauge",
        "On the primary, per standby: write lag (absent: idle).",
    ),
    "pg_stat_replication_flush_lag_seconds": (
        "gauge",
        "On the primary, per standby: flush lag (absent: idle).",
    ),
    "pg_stat_replication_replay_lag_seconds": (
        "gauge",
        "On the primary, per standby: replay lag (absent: idle).",
    ),
    "pg_stat_archiver_archived_count": ("counter", "WAL files archived."),
    "pg_stat_archiver_failed_count": ("counter", "Failed attempts to archive a WAL file."),
    "pg_stat_archiver_last_archive_age": (
        "gauge",
        "Seconds since a WAL file was last archived (absent: never).",
    ),
    "pg_stat_archiver_last_failed_age": ("gauge", "Seconds since archiving last failed (absent: never)."),
    "pg_stat_archiver_failing": ("gauge", "1 when the last archiving attempt failed."),
    "pg_stat_bgwriter_checkpoints_timed_total": ("counter", "Scheduled checkpoints."),
    "pg_stat_bgwriter_checkpoints_req_total": ("counter", "Requested checkpoints."),
    "pg_stat_bgwriter_checkpoint_write_time_total": ("counter", "Seconds spent writing checkpoint files."),
    "pg_stat_bgwriter_checkpoint_sync_time_total": ("counter", "Seconds spent syncing checkpoint files."),
    "pg_stat_bgwriter_buffers_checkpoint_total": ("counter", "Buffers written by checkpoints."),
    "pg_exporter_last_scrape_duration_seconds": ("gauge", "Wall time of the last scrape's queries."),
    "pg_exporter_last_scrape_cpu_seconds": ("gauge", "CPU time of this process for the last scrape."),
    "pg_exporter_last_scrape_queries": ("gauge", "Queries the last scrape ran."),
    "pg_exporter_database_sizes_age_seconds": ("gauge", "Age of the database sizes served."),
    "pg_exporter_last_scrape_error": ("gauge", "1 when the last scrape could not read PostgreSQL."),
    "pg_exporter_scrapes_total": ("counter", "Scrapes served."),
    "pg_exporter_scrape_errors_total": ("counter", "Scrapes that could not read PostgreSQL."),
}

Row = Mapping[str, Any]


@dataclass(frozen=True)
class Family:
    """One metric family: its name, type, help and samples (labels, value)."""

    name: str
    kind: str  # gauge | counter
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)


class Families:
    """Families of CATALOG in the order they were first added."""

    def __init__(self) -> None:
        self._by_name: dict[str, Family] = {}

    def add(self, name: str, value: float | None, **labels: str) -> None:
        if value is None:  # a figure PostgreSQL does not have (e.g. never archived): no sample
            return
        family = self._by_name.get(name)
        if family is None:
            kind, help_text = CATALOG[name]
            family = self._by_name[name] = Family(name, kind, help_text)
        family.samples.append((labels, float(value)))

    def __iter__(self) -> Iterator[Family]:
        return iter(self._by_name.values())

    def names(self) -> list[str]:
        return list(self._by_name)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def instance_samples(out: Families, row: Row) -> None:
    version = str(row["version"])
    out.add("pg_static", 1, version=version, short_version=version.split()[0])
    out.add("pg_settings_max_connections", row["max_connections"])
    out.add("pg_settings_superuser_reserved_connections", row["superuser_reserved_connections"])
    replica = bool(row["in_recovery"])
    out.add("pg_replication_is_replica", int(replica))
    out.add("pg_replication_lag_seconds", _num(row["lag_seconds"]))
    if replica:
        out.add("pg_stat_wal_receiver_streaming", 1 if int(row["wal_receivers_streaming"]) > 0 else 0)
    out.add("pg_postmaster_start_time_seconds", _num(row["start_time"]))
    out.add("pg_wal_lsn_bytes", _num(row["wal_lsn"]))


def activity_samples(out: Families, rows: Iterable[Row], databases: Iterable[str]) -> None:
    counts: dict[tuple[str, str], float] = {(db, state): 0.0 for db in databases for state in ACTIVITY_STATES}
    oldest: dict[tuple[str, str], float] = dict.fromkeys(counts, 0.0)
    for row in rows:
        key = (str(row["datname"]), str(row["state"] or "unknown"))
        counts[key] = counts.get(key, 0.0) + float(row["connections"])
        oldest[key] = max(oldest.get(key, 0.0), float(row["max_tx_seconds"] or 0))
    for (db, state), n in sorted(counts.items()):
        out.add("pg_stat_activity_count", n, datname=db, state=state)
    for (db, state), age in sorted(oldest.items()):
        out.add("pg_stat_activity_max_tx_duration", age, datname=db, state=state)


_DATABASE_COUNTERS = (
    "xact_commit", "xact_rollback", "deadlocks", "conflicts", "blks_read", "blks_hit", "tup_returned",
    "tup_fetched", "tup_inserted", "tup_updated", "tup_deleted", "temp_bytes",
)  # fmt: skip


def database_samples(out: Families, rows: Iterable[Row], sizes: Mapping[str, float]) -> None:
    """The counters of each database, and its size when `sizes` (by name, from SIZES_SQL) has it."""
    for row in rows:
        db = str(row["datname"])
        for column in _DATABASE_COUNTERS:
            out.add(f"pg_stat_database_{column}", _num(row[column]), datname=db)
        out.add("pg_database_size_bytes", sizes.get(db), datname=db)
        out.add("pg_database_wraparound_age_datfrozenxid", _num(row["age_datfrozenxid"]), datname=db)
        out.add("pg_database_wraparound_age_datminmxid", _num(row["age_datminmxid"]), datname=db)


def lock_samples(out: Families, rows: Iterable[Row], databases: Iterable[str]) -> None:
    waiting: dict[str, float] = dict.fromkeys(databases, 0.0)
    for row in rows:
        db = str(row["datname"])
        out.add("pg_locks_count", _num(row["granted"]), datname=db, mode=str(row["mode"]))
        waiting[db] = waiting.get(db, 0.0) + float(row["waiting"])
    for db, n in sorted(waiting.items()):
        out.add("pg_locks_waiting", n, datname=db)


def replication_samples(out: Families, rows: Iterable[Row]) -> None:
    for row in rows:
        labels = {
            key: str(row[key] if row[key] is not None else "")
            for key in ("application_name", "client_addr", "state", "slot_name")
        }
        out.add("pg_stat_replication_pg_wal_lsn_diff", _num(row["lag_bytes"]), **labels)
        for kind in ("write", "flush", "replay"):
            out.add(f"pg_stat_replication_{kind}_lag_seconds", _num(row[f"{kind}_lag_seconds"]), **labels)


def archiver_samples(out: Families, row: Row) -> None:
    out.add("pg_stat_archiver_archived_count", _num(row["archived_count"]))
    out.add("pg_stat_archiver_failed_count", _num(row["failed_count"]))
    out.add("pg_stat_archiver_last_archive_age", _num(row["last_archive_age"]))
    out.add("pg_stat_archiver_last_failed_age", _num(row["last_failed_age"]))
    out.add("pg_stat_archiver_failing", int(bool(row["failing"])))


def checkpoint_samples(out: Families, row: Row) -> None:
    out.add("pg_stat_bgwriter_checkpoints_timed_total", _num(row["timed"]))
    out.add("pg_stat_bgwriter_checkpoints_req_total", _num(row["requested"]))
    out.add("pg_stat_bgwriter_checkpoint_write_time_total", _num(row["write_seconds"]))
    out.add("pg_stat_bgwriter_checkpoint_sync_time_total", _num(row["sync_seconds"]))
    out.add("pg_stat_bgwriter_buffers_checkpoint_total", _num(row["buffers"]))


@dataclass(frozen=True)
class ScrapeStats:
    up: bool
    seconds: float
    cpu_seconds: float
    queries: int
    sizes_age: float | None = None


def exporter_samples(out: Families, stats: ScrapeStats, scrapes: int, errors: int) -> None:
    out.add("pg_up", int(stats.up))
    out.add("pg_exporter_last_scrape_duration_seconds", stats.seconds)
    out.add("pg_exporter_last_scrape_cpu_seconds", stats.cpu_seconds)
    out.add("pg_exporter_last_scrape_queries", stats.queries)
    out.add("pg_exporter_database_sizes_age_seconds", stats.sizes_age)
    out.add("pg_exporter_last_scrape_error", int(not stats.up))
    out.add("pg_exporter_scrapes_total", scrapes)
    out.add("pg_exporter_scrape_errors_total", errors)


# --- exposition --------------------------------------------------------------------------------------

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def render(families: Iterable[Family]) -> str:
    """Prometheus text format 0.0.4: HELP, TYPE, then one line per sample."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in family.samples:
            if labels:
                inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
                lines.append(f"{family.name}{{{inner}}} {_format_value(value)}")
            else:
                lines.append(f"{family.name} {_format_value(value)}")
    return "\n".join(lines) + "\n"


def database_names(rows: Sequence[Row]) -> list[str]:
    return [str(row["datname"]) for row in rows]
