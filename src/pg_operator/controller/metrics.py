"""The operator's Prometheus metrics, in a registry of their own (served on --metrics-port)."""

from __future__ import annotations

import time as _time
from collections import Counter as _Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "pg_operator_reconcile_total",
            "Reconcile passes by result (noop, changed, problem, error).",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "pg_operator_reconcile_duration_seconds",
            "Duration of one reconcile pass.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.clusters_by_phase = Gauge(
            "pg_operator_clusters",
            "PostgresClusters by phase (first word of status.phase).",
            ["phase"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "pg_operator_leader",
            "1 while this process holds the leader Lease.",
            registry=self.registry,
        )
        self.api_requests = Counter(
            "pg_operator_api_requests_total",
            "API requests made by the controller's client, by verb.",
            ["verb"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "pg_operator_workqueue_depth",
            "Clusters waiting for a reconcile.",
            registry=self.registry,
        )
        self._phases: dict[tuple[str, str], str] = {}
        # Backups (controller/backup_reconcilers): seconds since the primary last archived a WAL segment,
        # computed at scrape time from the last archived_time the controller read from pg_stat_archiver.
        self.wal_archive_age = Gauge(
            "pg_operator_wal_last_archived_age_seconds",
            "Seconds since the cluster's primary last archived a WAL segment (pg_stat_archiver).",
            ["namespace", "cluster"],
            registry=self.registry,
        )
        self._last_archived: dict[tuple[str, str], float] = {}
        # Base backups (the cluster's Backup objects), for the backup alerts and the dashboard.
        self.backup_last_success = Gauge(
            "pg_operator_backup_last_success_timestamp_seconds",
            "Unix time at which the cluster's newest completed base backup finished.",
            ["namespace", "cluster"],
            registry=self.registry,
        )
        self.backup_last_succeeded = Gauge(
            "pg_operator_backup_last_succeeded",
            "1 when the cluster's most recently finished base backup completed, 0 when it failed.",
            ["namespace", "cluster"],
            registry=self.registry,
        )

    def set_phase(self, key: tuple[str, str], phase: str | None) -> None:
        """Record a cluster's phase (None when the cluster is gone) and refresh the by-phase gauge."""
        if phase is None:
            self._phases.pop(key, None)
        else:
            self._phases[key] = (phase.split(":")[0].split() or ["Unknown"])[0]
        tally = _Tally(self._phases.values())
        for labels in list(self.clusters_by_phase._metrics):  # zero phases that emptied
            if labels[0] not in tally:
                self.clusters_by_phase.labels(phase=labels[0]).set(0)
        for phase_name, count in tally.items():
            self.clusters_by_phase.labels(phase=phase_name).set(count)

    def set_last_archived(self, key: tuple[str, str], timestamp: float) -> None:
        """Record when the cluster last archived WAL (Unix time); the gauge reports the age."""
        if key not in self._last_archived:
            self.wal_archive_age.labels(namespace=key[0], cluster=key[1]).set_function(
                lambda: _time.time() - self._last_archived.get(key, _time.time())
            )
        self._last_archived[key] = timestamp

    def forget_archive(self, key: tuple[str, str]) -> None:
        if self._last_archived.pop(key, None) is not None:
            self.wal_archive_age.remove(key[0], key[1])
        self.set_backups(key, None, None)

    def set_backups(self, key: tuple[str, str], last_success: float | None, succeeded: bool | None) -> None:
        """A cluster's base-backup figures; None removes a series (no such backup yet, or no backups)."""
        for gauge, value in (
            (self.backup_last_success, last_success),
            (self.backup_last_succeeded, None if succeeded is None else float(succeeded)),
        ):
            if value is not None:
                gauge.labels(namespace=key[0], cluster=key[1]).set(value)
            elif (key[0], key[1]) in _label_sets(gauge):
                gauge.remove(key[0], key[1])


def _label_sets(gauge: Gauge) -> set[tuple[str, ...]]:
    return {tuple(sample.labels.values()) for metric in gauge.collect() for sample in metric.samples}
