"""Replication lag and timeline per instance, from the state Patroni publishes on each pod."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from harness.objects import cluster_model
from harness.pods import cluster_pod as pod
from harness.pods import statefulset as sts
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.cluster_status import PostgresClusterStatus
from pg_operator.specs import compute_status
from pg_operator.specs.status import LAG_REPORT_GRANULARITY, replication_lag

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)
MIB = 1024 * 1024


def cluster(replicas: int = 3) -> PostgresCluster:
    return cluster_model(replicas=replicas, generation=2)


def member(i: int, role: str, position: int | None, timeline: int = 2, **kw: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"state": "running", "role": role, "timeline": timeline}
    if position is not None:
        state["xlog_location"] = position
    return pod(i, role, annotations={"status": json.dumps(state)}, **kw)


def test_lag_is_the_primary_position_minus_each_replica_position() -> None:
    pods = [
        member(0, "primary", 50 * MIB),
        member(1, "replica", 50 * MIB - 10),
        member(2, "replica", 47 * MIB),
    ]
    assert replication_lag("orders-db", pods) == {"orders-db-1": 10, "orders-db-2": 3 * MIB}


def test_status_reports_lag_in_whole_mib_and_the_timeline() -> None:
    pods = [
        member(0, "primary", 50 * MIB),
        member(1, "replica", 50 * MIB - 10),
        member(2, "replica", 47 * MIB - 1),
    ]
    status = compute_status(cluster(), previous=None, statefulset=sts(), pods=pods, now=T0)
    by_name = {i["name"]: i for i in status["instances"]}
    assert "lagBytes" not in by_name["orders-db-0"]  # the primary has no lag
    assert by_name["orders-db-1"]["lagBytes"] == 0  # a few bytes behind: no status rewrite per WAL write
    assert by_name["orders-db-2"]["lagBytes"] == 3 * LAG_REPORT_GRANULARITY
    assert {i["timeline"] for i in status["instances"]} == {2}
    parsed = PostgresClusterStatus.model_validate(status)
    assert parsed.model_dump(by_alias=True, mode="json", exclude_none=True) == status


def test_small_movements_give_an_equal_status() -> None:
    a = [member(0, "primary", 50 * MIB + 100), member(1, "replica", 50 * MIB + 10)]
    b = [member(0, "primary", 50 * MIB + 90_000), member(1, "replica", 50 * MIB + 2_000)]
    first = compute_status(cluster(2), previous=None, statefulset=sts(2), pods=a, now=T0)
    assert compute_status(cluster(2), previous=first, statefulset=sts(2), pods=b, now=T0) == first


def test_no_lag_without_one_primary_with_a_known_position() -> None:
    two_primaries = [member(0, "primary", 5 * MIB), member(1, "primary", 4 * MIB), member(2, "replica", MIB)]
    assert replication_lag("orders-db", two_primaries) == {}
    unknown_head = [member(0, "primary", None), member(1, "replica", MIB)]
    assert replication_lag("orders-db", unknown_head) == {}
    ahead_of_a_stale_sample = [member(0, "primary", MIB), member(1, "replica", 2 * MIB)]
    assert replication_lag("orders-db", ahead_of_a_stale_sample) == {"orders-db-1": 0}
    other_cluster = [
        member(0, "primary", MIB),
        {
            **member(1, "replica", 0),
            "metadata": {"name": "x-1", "labels": {"db.example.com/cluster": "x", "role": "replica"}},
        },
    ]
    assert replication_lag("orders-db", other_cluster) == {}
    garbage = [member(0, "primary", MIB), pod(1, annotations={"status": "[]"})]
    assert replication_lag("orders-db", garbage) == {}


def test_status_names_the_settings_an_instance_waits_to_restart_for() -> None:
    waiting = {
        "pending_restart": True,
        "pending_restart_reason": {
            "shared_buffers": {"old_value": "128MB", "new_value": "64MB"},
            "max_connections": {"old_value": "100", "new_value": "200"},
        },
    }
    pods = [member(0, "primary", 50 * MIB), member(1, "replica", 50 * MIB)]
    pods[1]["metadata"]["annotations"]["status"] = json.dumps(
        {**json.loads(pods[1]["metadata"]["annotations"]["status"]), **waiting}
    )
    status = compute_status(cluster(2), previous=None, statefulset=sts(2), pods=pods, now=T0)
    by_name = {i["name"]: i for i in status["instances"]}
    assert by_name["orders-db-1"]["pendingRestart"] == ["max_connections", "shared_buffers"]
    assert "pendingRestart" not in by_name["orders-db-0"]
    parsed = PostgresClusterStatus.model_validate(status)
    assert parsed.model_dump(by_alias=True, mode="json", exclude_none=True) == status
