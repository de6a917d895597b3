"""Per-instance gauges (replication lag, timeline), registered in the operator's metrics registry.

Exact lag lives here; the status carries it rounded to MiB so that it is not rewritten on every WAL
write. Series of instances (or clusters) that disappeared are removed, not left at their last value.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Gauge

LABELS = ["namespace", "cluster", "instance"]


class InstanceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.replication_lag = Gauge(
            "pg_operator_instance_replication_lag_bytes",
            "Bytes a replica is behind its primary, from the WAL positions Patroni publishes on the pods.",
            LABELS,
            registry=registry,
        )
        self.timeline = Gauge(
            "pg_operator_instance_timeline",
            "PostgreSQL timeline of each instance as Patroni reports it (it grows with each promotion).",
            LABELS,
            registry=registry,
        )
        self._series: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def set(self, key: tuple[str, str], lag: Mapping[str, int], timelines: Mapping[str, int]) -> None:
        """One cluster's figures; empty mappings when it is gone."""
        series = {("lag", n) for n in lag} | {("timeline", n) for n in timelines}
        for kind, name in self._series.pop(key, set()) - series:
            (self.replication_lag if kind == "lag" else self.timeline).remove(key[0], key[1], name)
        for name, value in lag.items():
            self.replication_lag.labels(namespace=key[0], cluster=key[1], instance=name).set(value)
        for name, value in timelines.items():
            self.timeline.labels(namespace=key[0], cluster=key[1], instance=name).set(value)
        if series:
            self._series[key] = series
