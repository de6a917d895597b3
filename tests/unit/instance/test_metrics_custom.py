"""The tenant's custom queries (postgres_exporter's queries.yaml format): parsing, the bounds that keep a
hostile file from costing the instance, and the samples made from rows (plain dicts)."""

from __future__ import annotations

import pytest

from harness.objects import cluster_model as cluster
from pg_operator.instance import metrics as m
from pg_operator.instance import metrics_custom as mc
from pg_operator.specs.statefulset import statefulset

GOOD = """
pg_app_orders:
  query: "SELECT status, count(*) AS total, max(age) AS oldest_seconds FROM app.orders GROUP BY status"
  master: true
  metrics:
    - status:
        usage: "LABEL"
        description: "Order status"
    - total:
        usage: "GAUGE"
        description: "Orders per status"
    - oldest_seconds:
        usage: "GAUGE"
        description: "Age of the oldest order"
pg_app_events:
  query: "SELECT 7 AS processed, 'x' AS ignored"
  metrics:
    - processed:
        usage: "COUNTER"
        description: "Events processed"
    - ignored:
        usage: "DISCARD"
"""


def refused(text: str) -> str:
    with pytest.raises(mc.QueriesRefused) as err:
        mc.parse(text)
    return str(err.value)


def test_parses_postgres_exporters_format() -> None:
    orders, events = mc.parse(GOOD)
    assert orders.prefix == "pg_app_orders" and orders.primary_only
    assert orders.labels == ("status",)
    assert [c.name for c in orders.values] == ["total", "oldest_seconds"]
    assert events.values[0].usage is mc.Usage.COUNTER and not events.primary_only


def test_samples_carry_the_label_columns() -> None:
    orders, events = mc.parse(GOOD)
    rows = [
        {"status": "open", "total": 3, "oldest_seconds": 12.5},
        {"status": "paid", "total": 9, "oldest_seconds": None},
    ]
    text = m.render(mc.samples(orders, rows) + mc.samples(events, [{"processed": 7, "ignored": "x"}]))
    assert "# TYPE pg_app_orders_total gauge" in text
    assert 'pg_app_orders_total{status="open"} 3' in text
    assert 'pg_app_orders_oldest_seconds{status="open"} 12.5' in text
    assert 'pg_app_orders_oldest_seconds{status="paid"}' not in text  # NULL: no sample
    assert "# TYPE pg_app_events_processed counter" in text and "pg_app_events_processed 7" in text


def test_a_wrong_column_or_a_non_number_is_an_error_of_that_query() -> None:
    orders, _ = mc.parse(GOOD)
    with pytest.raises(ValueError, match="no column oldest_seconds"):
        mc.samples(orders, [{"status": "open", "total": 1}])
    with pytest.raises(ValueError, match="column total is not a number"):
        mc.samples(orders, [{"status": "open", "total": "many", "oldest_seconds": 1}])


def test_errors_are_served_per_query() -> None:
    text = m.render(mc.own_families(False, 2, {"pg_app_orders": 3}))
    assert 'pgop_custom_query_errors_total{query="pg_app_orders"} 3' in text
    assert "pgop_custom_queries_invalid 0" in text and "pgop_custom_queries 2" in text


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: [", "not YAML at line"),
        ("- a\n- b\n", "must be a mapping of metric-name prefix"),
        ("9bad:\n  query: SELECT 1\n  metrics: [{a: {usage: GAUGE}}]\n", "Prometheus metric name prefix"),
        (
            "q:\n  query: SELECT 1\n  metrics: [{a-b: {usage: GAUGE}}]\n",
            "q.metrics.a-b: a column must be named",
        ),
        (
            "q:\n  query: SELECT 1\n  metrics: [{a: {usage: HISTOGRAM}}]\n",
            "q.metrics.a.usage: 'HISTOGRAM' is not",
        ),
        ("q:\n  query: SELECT 1\n  metrics: [{a: {usage: LABEL}}]\n", "no GAUGE or COUNTER column"),
        ("q:\n  query: SELECT 1\n  cache_seconds: 30\n  metrics: [{a: {usage: GAUGE}}]\n", "unknown keys"),
        ("q:\n  query: ''\n  metrics: [{a: {usage: GAUGE}}]\n", "q.query: a statement"),
        ("pg:\n  query: SELECT 1\n  metrics: [{up: {usage: GAUGE}}]\n", "pg_up is already served"),
        ("pgop_custom:\n  query: SELECT 1\n  metrics: [{queries: {usage: GAUGE}}]\n", "already served"),
        (
            "a:\n  query: SELECT 1\n  metrics: [{b_c: {usage: GAUGE}}]\n"
            "a_b:\n  query: SELECT 1\n  metrics: [{c: {usage: GAUGE}}]\n",
            "a_b.metrics.c: a_b_c is already served",
        ),
    ],
)
def test_a_file_breaking_a_rule_is_refused_naming_the_field(text: str, needle: str) -> None:
    assert needle in refused(text)


def test_a_query_may_name_its_database_and_the_databases_are_bounded() -> None:
    (query,) = mc.parse("q:\n  query: SELECT 1 AS v\n  database: app\n  metrics: [{v: {usage: GAUGE}}]\n")
    assert query.database == "app"
    assert mc.parse(GOOD)[0].database == "postgres"
    bad = "q:\n  query: SELECT 1 AS v\n  database: 'App; x'\n  metrics: [{v: {usage: GAUGE}}]\n"
    assert "q.database: a database name" in refused(bad)
    many = "".join(
        f"q{i}:\n  query: SELECT 1 AS v\n  database: db{i}\n  metrics: [{{v: {{usage: GAUGE}}}}]\n"
        for i in range(mc.MAX_DATABASES + 1)
    )
    assert f"databases besides postgres; at most {mc.MAX_DATABASES}" in refused(many)


def test_the_file_is_bounded_in_size_and_queries() -> None:
    one = "  query: SELECT 1 AS v\n  metrics: [{v: {usage: GAUGE}}]\n"
    many = "".join(f"q{i}:\n{one}" for i in range(mc.MAX_QUERIES + 1))
    assert f"at most {mc.MAX_QUERIES}" in refused(many)
    huge = "q:\n  query: SELECT 1 AS v -- " + "x" * mc.MAX_FILE_BYTES + "\n  metrics: [{v: {usage: GAUGE}}]\n"
    assert f"at most {mc.MAX_FILE_BYTES}" in refused(huge)
    assert mc.parse("") == []


def test_the_instances_mount_the_configmap_optionally() -> None:
    sts = statefulset(
        cluster(monitoring={"customQueries": {"configMapName": "app-metrics", "key": "q.yaml"}})
    )
    pod = sts["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "custom-queries"]
    assert volume["configMap"] == {
        "name": "app-metrics",
        "items": [{"key": "q.yaml", "path": "queries.yaml"}],
        "optional": True,
        "defaultMode": 0o444,
    }
    mounts = pod["containers"][0]["volumeMounts"]
    assert {
        "name": "custom-queries",
        "mountPath": "/etc/pg-operator/custom-queries",
        "readOnly": True,
    } in mounts
    plain = statefulset(cluster())["spec"]["template"]["spec"]
    assert all(v["name"] != "custom-queries" for v in plain["volumes"])
