"""The instance's /metrics: samples from rows as PostgreSQL returns them (plain dicts), the text format,
and the contract with deploy/monitoring/ (every pg_* name an alert or a panel reads is one we serve)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from pg_operator.instance import metrics as m
from pg_operator.instance.session_roles import monitor_role_statements

MONITORING = Path(__file__).resolve().parents[3] / "deploy" / "monitoring"


def families(out: m.Families) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: f.samples for f in out}


def primary_row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "version_num": 160015, "version": "16.15 (Debian)", "max_connections": 100,
        "superuser_reserved_connections": 3, "in_recovery": False, "lag_seconds": None,
        "wal_receivers_streaming": 0, "start_time": 1796215402.5, "wal_lsn": 23871192,
    }  # fmt: skip
    row.update(overrides)
    return row


def test_primary_instance_has_no_replica_figures() -> None:
    out = m.Families()
    m.instance_samples(out, primary_row())
    got = families(out)
    assert got["pg_replication_is_replica"] == [({}, 0.0)]
    assert got["pg_static"] == [({"version": "16.15 (Debian)", "short_version": "16.15"}, 1.0)]
    assert got["pg_settings_max_connections"] == [({}, 100.0)]
    assert "pg_replication_lag_seconds" not in got  # NULL on a primary: no sample, not a zero
    assert "pg_stat_wal_receiver_streaming" not in got


def test_standby_reports_lag_and_whether_it_streams() -> None:
    out = m.Families()
    row = primary_row(in_recovery=True, lag_seconds=4.5, wal_receivers_streaming=0, wal_lsn=None)
    m.instance_samples(out, row)
    got = families(out)
    assert got["pg_replication_is_replica"] == [({}, 1.0)]
    assert got["pg_replication_lag_seconds"] == [({}, 4.5)]
    assert got["pg_stat_wal_receiver_streaming"] == [({}, 0.0)]
    assert "pg_wal_lsn_bytes" not in got


def test_activity_is_zero_filled_per_database_and_state() -> None:
    out = m.Families()
    rows = [
        {"datname": "app", "state": "active", "connections": 2, "max_tx_seconds": 1.5},
        {"datname": "app", "state": "idle in transaction", "connections": 1, "max_tx_seconds": 700.0},
    ]
    m.activity_samples(out, rows, ["app", "postgres"])
    got = families(out)
    counts = {(lb["datname"], lb["state"]): v for lb, v in got["pg_stat_activity_count"]}
    assert counts[("app", "active")] == 2
    assert counts[("app", "idle in transaction")] == 1
    assert counts[("postgres", "active")] == 0
    assert len(counts) == 2 * len(m.ACTIVITY_STATES)
    oldest = {(lb["datname"], lb["state"]): v for lb, v in got["pg_stat_activity_max_tx_duration"]}
    assert oldest[("app", "idle in transaction")] == 700.0


def test_database_counters_sizes_and_wraparound_age() -> None:
    row = {c: 7 for c in m._DATABASE_COUNTERS} | {
        "datname": "app", "age_datfrozenxid": 1_200_000_000, "age_datminmxid": 3,
    }  # fmt: skip
    new_db = row | {"datname": "new"}  # created since the sizes were read: no size yet, not a zero
    out = m.Families()
    m.database_samples(out, [row, new_db], {"app": 8e6})
    got = families(out)
    assert got["pg_stat_database_xact_commit"] == [({"datname": "app"}, 7.0), ({"datname": "new"}, 7.0)]
    assert ({"datname": "app"}, 7.0) in got["pg_stat_database_deadlocks"]
    assert got["pg_database_size_bytes"] == [({"datname": "app"}, 8e6)]
    assert ({"datname": "app"}, 1.2e9) in got["pg_database_wraparound_age_datfrozenxid"]


def test_locks_waiting_summed_per_database_with_zeros() -> None:
    rows = [
        {"datname": "app", "mode": "RowExclusiveLock", "granted": 3, "waiting": 2},
        {"datname": "app", "mode": "AccessExclusiveLock", "granted": 1, "waiting": 1},
    ]
    out = m.Families()
    m.lock_samples(out, rows, ["app", "postgres"])
    got = families(out)
    assert sorted(got["pg_locks_waiting"], key=lambda s: s[0]["datname"]) == [
        ({"datname": "app"}, 3.0),
        ({"datname": "postgres"}, 0.0),
    ]
    assert ({"datname": "app", "mode": "RowExclusiveLock"}, 3.0) in got["pg_locks_count"]


def test_replication_per_standby_with_absent_idle_lag() -> None:
    rows = [
        {"application_name": "db-1", "client_addr": "10.0.0.5", "state": "streaming", "slot_name": "db_1",
         "lag_bytes": 4096, "replay_lag_seconds": 0.25, "write_lag_seconds": None, "flush_lag_seconds": None},
    ]  # fmt: skip
    out = m.Families()
    m.replication_samples(out, rows)
    got = families(out)
    labels = {"application_name": "db-1", "client_addr": "10.0.0.5", "state": "streaming",
              "slot_name": "db_1"}  # fmt: skip
    assert got["pg_stat_replication_pg_wal_lsn_diff"] == [(labels, 4096.0)]
    assert got["pg_stat_replication_replay_lag_seconds"] == [(labels, 0.25)]
    assert "pg_stat_replication_write_lag_seconds" not in got


@pytest.mark.parametrize(
    ("archived_age", "failed_age", "failing"),
    [(None, None, False), (12.0, None, False), (12.0, 3.0, True)],
)
def test_archiver(archived_age: float | None, failed_age: float | None, failing: bool) -> None:
    out = m.Families()
    m.archiver_samples(out, {"archived_count": 5, "failed_count": 2, "last_archive_age": archived_age,
                             "last_failed_age": failed_age, "failing": failing})  # fmt: skip
    got = families(out)
    assert got["pg_stat_archiver_failing"] == [({}, float(failing))]
    assert ("pg_stat_archiver_last_archive_age" in got) == (archived_age is not None)
    assert ("pg_stat_archiver_last_failed_age" in got) == (failed_age is not None)


def test_checkpoint_view_follows_the_server_version() -> None:
    assert "pg_stat_bgwriter" in m.checkpoints_sql(160015)
    assert "pg_stat_checkpointer" in m.checkpoints_sql(170002)


def test_a_failed_scrape_says_so() -> None:
    out = m.Families()
    m.exporter_samples(out, m.ScrapeStats(up=False, seconds=0.01, cpu_seconds=0.001, queries=0), 4, 1)
    got = families(out)
    assert got["pg_up"] == [({}, 0.0)]
    assert got["pg_exporter_last_scrape_error"] == [({}, 1.0)]
    assert got["pg_exporter_scrape_errors_total"] == [({}, 1.0)]


def test_text_format_escapes_and_numbers() -> None:
    out = m.Families()
    out.add("pg_locks_count", 3, datname='we"ird\\name\n', mode="x")
    out.add("pg_exporter_last_scrape_duration_seconds", 0.25)
    text = m.render(out)
    assert text.endswith("\n")
    assert "# TYPE pg_locks_count gauge" in text
    assert 'pg_locks_count{datname="we\\"ird\\\\name\\n",mode="x"} 3\n' in text
    assert "pg_exporter_last_scrape_duration_seconds 0.25\n" in text


def test_unknown_family_is_refused() -> None:
    with pytest.raises(KeyError):
        m.Families().add("pg_made_up", 1)


def test_monitor_role_is_least_privileged() -> None:
    statements = [s.as_string(None) for s in monitor_role_statements()]
    assert statements[0].startswith('CREATE ROLE "pgop_monitor" LOGIN NOSUPERUSER')
    assert statements[1] == 'GRANT pg_monitor TO "pgop_monitor"'


# --- the contract with deploy/monitoring ---------------------------------------------------------------

# Series the rules and the dashboard read that other pieces serve: Prometheus itself, Patroni (8008),
# the kubelet, the operator (controller/metrics.py and the names docs/monitoring.md asks it to serve).
EXTERNAL = re.compile(r"^(up|ALERTS|patroni_\w+|kubelet_\w+|pg_operator_\w+)$")
FUNCTIONS_AND_KEYWORDS = {
    "sum", "count", "max", "min", "avg", "rate", "irate", "increase", "by", "without", "on", "ignoring",
    "group_left", "group_right", "and", "or", "unless", "time", "label_replace", "absent", "vector",
    "clamp_min", "clamp_max", "bool", "topk", "offset", "changes", "max_over_time", "min_over_time",
    "histogram_quantile", "le", "delta", "deriv", "scalar", "sort", "resets", "count_values", "abs",
}  # fmt: skip


def names_in(expr: str) -> set[str]:
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # selectors
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    tokens = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", expr))
    return {t for t in tokens if t not in FUNCTIONS_AND_KEYWORDS and not re.fullmatch(r"\d\w*", t)}


def rule_expressions() -> list[str]:
    doc = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def dashboard_expressions() -> list[str]:
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def recorded_names() -> set[str]:
    doc = yaml.safe_load((MONITORING / "prometheus-rules.yaml").read_text())
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_name_read_is_served(source: str) -> None:
    exprs = rule_expressions() if source == "rules" else dashboard_expressions()
    assert exprs
    unknown = sorted(
        n
        for e in exprs
        for n in names_in(e)
        if n not in m.CATALOG and n not in recorded_names() and not EXTERNAL.match(n)
    )
    assert unknown == []


def test_the_names_walk_finds_names() -> None:
    got = names_in('sum by (namespace) (rate(pg_stat_database_xact_commit{datname!="x"}[5m])) > on (pod) up')
    assert got == {"pg_stat_database_xact_commit", "up"}
