"""Scheduled backups pause while their cluster hibernates (no Backup, so no Job) and resume after the wake,
the runs missed meanwhile collapsed into one."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pg_operator.backup.scheduling import cluster_hibernating, schedule_pass

T0 = dt.datetime(2026, 12, 1, 8, 0, 10, tzinfo=dt.UTC)


def scheduled(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "nightly", "namespace": "shop", "uid": "u1",
                         "creationTimestamp": "2026-12-01T08:00:10Z"},
            "spec": {"cluster": "db", "schedule": "*/5 * * * *"}, "status": status}  # fmt: skip


def test_a_hibernating_or_waking_cluster_pauses_its_schedules() -> None:
    assert cluster_hibernating({"spec": {"hibernation": True}})
    assert cluster_hibernating(
        {"spec": {"hibernation": False}, "status": {"hibernation": {"phase": "WakingPrimary"}}}
    )
    assert not cluster_hibernating({"spec": {"replicas": 3}, "status": {"phase": "Healthy"}})
    assert not cluster_hibernating(None)


def test_no_backup_while_paused_and_one_for_the_missed_runs_after() -> None:
    last = {"lastScheduleTime": "2026-12-01T08:05:00Z"}
    later = T0 + dt.timedelta(hours=3)
    paused = schedule_pass(scheduled(**last), later, paused=True)
    assert paused.backup is None and paused.status.get("lastScheduleTime") == "2026-12-01T08:05:00Z"
    resumed = schedule_pass(scheduled(**last), later)
    assert resumed.backup is not None
    assert resumed.status["lastScheduleTime"] == "2026-12-01T11:00:00Z"  # the latest run stands for all
