"""After a promotion the operator wakes the Patroni loops that would sleep out loop_wait: the new leader
until it has recorded a synchronous standby, and members off its timeline once they can pg_rewind."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.pods import instance_pod
from pg_operator.orchestration.failover import NUDGE_WINDOW_SECONDS, plan_nudges
from pg_operator.orchestration.instances import instances_from_pods

NOW = datetime(2026, 12, 4, 21, 0, tzinfo=UTC)


def member(
    name: str, role: str = "replica", ip: str = "10.0.0.1", container: str = "running", **published: Any
) -> dict[str, Any]:
    pod = instance_pod(name, role, container=container)
    pod["status"]["podIP"] = ip
    pod["metadata"]["annotations"] = {"status": json.dumps(published)}
    return pod


def leader_cm(holder: str, transitions: int = 1, age_s: float = 3) -> dict[str, Any]:
    acquired = (NOW - timedelta(seconds=age_s)).isoformat()
    return {
        "metadata": {
            "name": "db-leader",
            "annotations": {"leader": holder, "acquireTime": acquired, "transitions": str(transitions)},
        }
    }


def sync_cm(leader: str, standbys: str = "") -> dict[str, Any]:
    return {"metadata": {"name": "db-sync", "annotations": {"leader": leader, "sync_standby": standbys}}}


def names(pods: list[dict[str, Any]], leader: dict[str, Any], sync: dict[str, Any] | None) -> list[str]:
    return [n.member for n in plan_nudges(leader, instances_from_pods(pods), sync, NOW)]


def test_a_member_that_must_rewind_is_woken_once_the_leader_published_its_checkpoint() -> None:
    pods = [
        member("db-0", container="terminated"),
        member("db-1", "primary", timeline=2, state="running"),
        member("db-2", timeline=1, state="running"),
    ]
    assert names(pods, leader_cm("db-1"), sync_cm("db-1", "db-2")) == ["db-2"]
    # Until the checkpoint is published a rewind cannot start: nobody to wake.
    pods[1] = member("db-1", "primary", timeline=2, state="running", checkpoint_after_promote=False)
    assert names(pods, leader_cm("db-1"), sync_cm("db-1", "db-2")) == []


def test_a_stopped_member_without_a_timeline_is_woken_and_one_on_the_timeline_is_not() -> None:
    pods = [
        member("db-0", state="stopped"),
        member("db-1", "primary", timeline=3, state="running"),
        member("db-2", timeline=3, state="running", replication_state="streaming"),
    ]
    assert names(pods, leader_cm("db-1"), sync_cm("db-1", "db-2")) == ["db-0"]


def test_the_leader_is_woken_while_a_streaming_replica_is_not_a_voter() -> None:
    streaming = {"timeline": 2, "state": "running", "replication_state": "streaming"}
    pods = [
        member("db-0", **streaming),
        member("db-1", "primary", timeline=2, state="running"),
        member("db-2", **streaming),
    ]
    nudges = plan_nudges(leader_cm("db-1"), instances_from_pods(pods), sync_cm("db-1", "db-0"), NOW)
    assert [(n.member, "db-2" in n.reason) for n in nudges] == [("db-1", True)]
    assert names(pods, leader_cm("db-1"), sync_cm("db-1", "db-0,db-2")) == []
    # Recorded for the previous leader: neither counts yet.
    assert names(pods, leader_cm("db-1"), sync_cm("db-0", "db-1,db-2")) == ["db-1"]
    # Not only after a promotion: a replica that came back and streams is made a voter at once.
    assert names(pods, leader_cm("db-1", transitions=0, age_s=3600), sync_cm("db-1", "db-0")) == ["db-1"]
    # Asynchronous replication has no voters to add.
    assert names(pods, leader_cm("db-1"), {"metadata": {"name": "db-sync", "annotations": {}}}) == []
    assert names(pods, leader_cm("db-1"), None) == []


def test_a_replica_that_does_not_stream_on_the_leaders_timeline_is_not_waited_for() -> None:
    pods = [
        member("db-0", timeline=1, state="running", replication_state="streaming"),  # must rewind
        member("db-1", "primary", timeline=2, state="running"),
        member("db-2", timeline=2, state="running", replication_state="in archive recovery"),
    ]
    assert names(pods, leader_cm("db-1", age_s=NUDGE_WINDOW_SECONDS + 1), sync_cm("db-1")) == []


def test_rewinds_are_woken_only_within_the_window_after_a_promotion() -> None:
    pods = [member("db-0", state="stopped"), member("db-1", "primary", timeline=2, state="running")]
    assert names(pods, leader_cm("db-1"), sync_cm("db-1")) == ["db-0"]
    assert names(pods, leader_cm("db-1", age_s=NUDGE_WINDOW_SECONDS + 1), sync_cm("db-1")) == []
    assert names(pods, leader_cm("db-1", transitions=0), sync_cm("db-1")) == []
    assert names(pods, leader_cm("db-1", age_s=-60), sync_cm("db-1")) == []


def test_nothing_while_the_leader_is_down_or_not_yet_labelled_primary() -> None:
    pods = [
        member("db-0", state="stopped"),
        member("db-1", "primary", container="terminated", timeline=2, state="running"),
        member("db-2", timeline=2, state="running", replication_state="streaming"),
    ]
    assert names(pods, leader_cm("db-1"), sync_cm("db-1")) == []
    pods[1] = member("db-1", "replica", timeline=2, state="running")
    assert names(pods, leader_cm("db-1"), sync_cm("db-1")) == []
