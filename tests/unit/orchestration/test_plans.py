"""Rollout order, switchover before scale-down, and when a dead primary's leader key may be released."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from harness.pods import NEW_IMAGE, NOW, OLD_IMAGE, leader_cm
from harness.pods import instance_pod as pod
from pg_operator.orchestration.failover import leader_holder, plan_lock_release
from pg_operator.orchestration.instances import Instance, instances_from_pods, parse_members
from pg_operator.orchestration.rollout import best_candidate, plan_scale, plan_update

OLD, NEW = OLD_IMAGE, NEW_IMAGE


def members(*rows: tuple[str, str, str, Any]) -> dict[str, Any]:
    return {
        "members": [{"name": n, "role": r, "state": s, "lag": lag, "timeline": 1} for n, r, s, lag in rows]
    }


def three(images: tuple[str, str, str] = (OLD, OLD, OLD), **kw: Any) -> list[Instance]:
    pods = [
        pod("db-0", "primary", images[0]),
        pod("db-1", "replica", images[1]),
        pod("db-2", "replica", images[2]),
    ]
    m = parse_members(
        members(
            ("db-0", "leader", "running", 0),
            ("db-1", "replica", "streaming", 0),
            ("db-2", "replica", "streaming", kw.get("lag2", 0)),
        )
    )
    return instances_from_pods(pods, m)


def test_members_parse_unknown_lag_as_none() -> None:
    m = parse_members(members(("a", "leader", "running", None), ("b", "replica", "streaming", "unknown")))
    assert m["a"].lag_bytes == 0 and m["a"].is_leader
    assert m["b"].lag_bytes is None and m["b"].streaming


def test_rollout_starts_with_the_highest_replica() -> None:
    action = plan_update(three(), NEW, 3, NOW)
    assert (action.kind, action.target) == ("delete_pod", "db-2")


def test_rollout_waits_while_any_instance_is_down() -> None:
    pods = [
        pod("db-0", "primary"),
        pod("db-1"),
        pod("db-2", image=NEW, ready=False, age=timedelta(seconds=20)),
    ]
    action = plan_update(instances_from_pods(pods), NEW, 3, NOW)
    assert action.kind == "wait" and "db-2" in action.reason


def test_rollout_waits_for_the_upgraded_replica_to_catch_up() -> None:
    action = plan_update(three((OLD, OLD, NEW), lag2=10**9), NEW, 3, NOW)
    assert action.kind == "wait" and "catch up" in action.reason


def test_rollout_then_next_replica_then_switchover_then_old_primary() -> None:
    assert plan_update(three((OLD, OLD, NEW)), NEW, 3, NOW).target == "db-1"
    switch = plan_update(three((OLD, NEW, NEW)), NEW, 3, NOW)
    assert switch.kind == "switchover" and switch.target in ("db-1", "db-2")
    # After the switchover db-0 is a replica with the old image: it goes last.
    pods = [pod("db-0", "replica", OLD), pod("db-1", "primary", NEW), pod("db-2", "replica", NEW)]
    after = parse_members(
        members(
            ("db-0", "replica", "streaming", 0),
            ("db-1", "leader", "running", 0),
            ("db-2", "replica", "streaming", 0),
        )
    )
    last = plan_update(instances_from_pods(pods, after), NEW, 3, NOW)
    assert (last.kind, last.target) == ("delete_pod", "db-0")
    # Without Patroni's word on lag, an upgraded replica is not known to be caught up: wait.
    assert plan_update(instances_from_pods(pods), NEW, 3, NOW).kind == "wait"
    done = [pod("db-0", "replica", NEW), pod("db-1", "primary", NEW), pod("db-2", "replica", NEW)]
    assert plan_update(instances_from_pods(done), NEW, 3, NOW).kind == "none"


def test_rollout_halts_when_an_upgraded_instance_never_becomes_ready() -> None:
    pods = [
        pod("db-0", "primary"),
        pod("db-1"),
        pod("db-2", image=NEW, ready=False, age=timedelta(minutes=9)),
    ]
    action = plan_update(instances_from_pods(pods), NEW, 3, NOW)
    assert action.kind == "halt" and action.target == "db-2" and "rollout stopped" in action.reason


def test_single_instance_restarts_in_place() -> None:
    action = plan_update(instances_from_pods([pod("db-0", "primary")]), NEW, 1, NOW)
    assert (action.kind, action.target) == ("delete_pod", "db-0")


def test_rollout_waits_for_a_missing_instance() -> None:
    action = plan_update(instances_from_pods([pod("db-0", "primary"), pod("db-1")]), NEW, 3, NOW)
    assert action.kind == "wait" and "missing" in action.reason


def test_scale_down_never_removes_the_primary() -> None:
    pods = [pod("db-0"), pod("db-1"), pod("db-2"), pod("db-3"), pod("db-4", "primary")]
    replicas, action = plan_scale(instances_from_pods(pods), 2)
    assert replicas == 5 and action.kind == "switchover" and action.target in ("db-0", "db-1")
    pods[4], pods[1] = pod("db-4"), pod("db-1", "primary")
    assert plan_scale(instances_from_pods(pods), 2) == (2, plan_scale([], 0)[1])


def test_scale_up_is_immediate() -> None:
    replicas, action = plan_scale(three(), 5)
    assert replicas == 5 and action.kind == "none"


def test_scale_down_waits_without_a_streaming_survivor() -> None:
    pods = [pod("db-0", ready=False), pod("db-1", ready=False), pod("db-2", "primary")]
    replicas, action = plan_scale(instances_from_pods(pods), 1)
    assert replicas == 3 and action.kind == "wait"


def test_lock_released_when_the_kubelet_reports_the_primary_container_dead() -> None:
    pods = [pod("db-0", "primary", ready=False, container="terminated"), pod("db-1"), pod("db-2")]
    release = plan_lock_release(leader_cm("db-0"), instances_from_pods(pods))
    assert release is not None and release.holder == "db-0"
    assert release.patch() == {"metadata": {"resourceVersion": "42", "annotations": {"leader": None}}}


def test_lock_released_while_the_container_waits_to_restart() -> None:
    pods = [pod("db-0", "primary", ready=False, container="waiting", restarts=1), pod("db-1")]
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(pods)) is not None


def test_lock_kept_when_death_is_not_certain() -> None:
    alive = [pod("db-0", "primary"), pod("db-1")]
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(alive)) is None
    graceful = [pod("db-0", "primary", terminating=True, container="terminated"), pod("db-1")]
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(graceful)) is None
    gone = [pod("db-1"), pod("db-2")]  # deleted from the API: maybe force-deleted while running
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(gone)) is None
    first_start = [pod("db-0", "primary", ready=False, container="waiting", restarts=0), pod("db-1")]
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(first_start)) is None


def test_lock_kept_without_a_running_replica_or_holder() -> None:
    lonely = [
        pod("db-0", "primary", ready=False, container="terminated"),
        pod("db-1", ready=False, container="terminated"),
    ]
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(lonely)) is None
    assert plan_lock_release(leader_cm(None), instances_from_pods(lonely)) is None
    assert leader_holder(None) is None


def test_switchover_candidates_are_the_synchronous_standbys_when_there_are_any() -> None:
    pods = [pod("db-0", "primary"), pod("db-1"), pod("db-2")]
    m = parse_members(
        members(
            ("db-0", "leader", "running", 0),
            ("db-1", "replica", "streaming", 0),
            ("db-2", "sync_standby", "streaming", 100),
        )
    )
    chosen = best_candidate(instances_from_pods(pods, m))
    assert chosen is not None and chosen.name == "db-2"
    asynchronous = parse_members(
        members(
            ("db-0", "leader", "running", 0),
            ("db-1", "replica", "streaming", 0),
            ("db-2", "replica", "streaming", 100),
        )
    )
    chosen = best_candidate(instances_from_pods(pods, asynchronous))
    assert chosen is not None and chosen.name == "db-1"
