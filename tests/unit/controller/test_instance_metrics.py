"""Per-instance lag and timeline gauges: set, updated, and removed with the instance or the cluster."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pg_operator.controller.instance_metrics import InstanceMetrics


def value(registry: CollectorRegistry, name: str, instance: str) -> float | None:
    return registry.get_sample_value(name, {"namespace": "shop", "cluster": "db", "instance": instance})


def test_lag_and_timeline_series_follow_the_instances() -> None:
    registry = CollectorRegistry()
    metrics = InstanceMetrics(registry)
    metrics.set(("shop", "db"), {"db-1": 100, "db-2": 7}, {"db-0": 2, "db-1": 2, "db-2": 2})
    assert value(registry, "pg_operator_instance_replication_lag_bytes", "db-1") == 100
    assert value(registry, "pg_operator_instance_timeline", "db-2") == 2
    # db-1 promoted (no lag now), db-0 follows it, db-2 is gone.
    metrics.set(("shop", "db"), {"db-0": 5}, {"db-0": 3, "db-1": 3})
    assert value(registry, "pg_operator_instance_replication_lag_bytes", "db-1") is None
    assert value(registry, "pg_operator_instance_replication_lag_bytes", "db-2") is None
    assert value(registry, "pg_operator_instance_replication_lag_bytes", "db-0") == 5
    assert value(registry, "pg_operator_instance_timeline", "db-2") is None
    metrics.set(("shop", "db"), {}, {})
    assert value(registry, "pg_operator_instance_timeline", "db-0") is None
