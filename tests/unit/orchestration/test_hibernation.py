"""Hibernation's workflow (pure): the primary recorded before anything stops, replicas stopped before the
primary, the StatefulSet scaled to 0 only once every PostgreSQL stopped, and on wake the recorded primary
started alone first; every move through the transition table."""

from __future__ import annotations

from typing import Any

import pytest

from harness.pods import instance_pod
from pg_operator.orchestration.hibernation import (
    ClusterView,
    HibernationPhase,
    HibernationState,
    TransitionRefused,
    plan_hibernation,
    without_pods,
)
from pg_operator.orchestration.instances import instances_from_pods

P = HibernationPhase
ALL = frozenset({"db-0", "db-1", "db-2"})


def pods(primary: str = "db-1", *, ready: bool = True) -> list[dict[str, Any]]:
    return [instance_pod(n, "primary" if n == primary else "replica", ready=ready) for n in sorted(ALL)]


def view(wanted: bool, pod_list: list[dict[str, Any]], stopped: frozenset[str] = frozenset(),
         **extra: Any) -> ClusterView:  # fmt: skip
    return ClusterView("db", 3, wanted, instances_from_pods(pod_list), stopped, **extra)


def test_an_awake_cluster_not_asked_to_hibernate_stays_as_it_is() -> None:
    step = plan_hibernation(HibernationState(), view(False, pods()))
    assert step.state == HibernationState() and not step.hibernating
    assert step.stop == frozenset() and step.statefulset_replicas is None and not step.pooler_stopped


def test_hibernating_records_the_primary_and_stops_the_replicas_first() -> None:
    step = plan_hibernation(HibernationState(), view(True, pods("db-1")))
    assert step.state == HibernationState(P.STOPPING_REPLICAS, "db-1")
    assert step.stop == {"db-0", "db-2"}  # never the primary while a replica's Patroni may still run
    assert step.pooler_stopped and step.statefulset_replicas is None
    assert "db-0, db-2" in step.waiting


def test_once_the_replicas_stopped_the_primary_stops_and_then_the_pods_go() -> None:
    state = HibernationState(P.STOPPING_REPLICAS, "db-1")
    step = plan_hibernation(state, view(True, pods("db-1"), frozenset({"db-0"})))
    assert step.state == state  # db-2 still runs PostgreSQL
    step = plan_hibernation(state, view(True, pods("db-1"), frozenset({"db-0", "db-2"})))
    assert step.state == HibernationState(P.STOPPING_PRIMARY, "db-1")
    assert step.stop == ALL and step.statefulset_replicas is None  # pods stay until PostgreSQL stopped
    step = plan_hibernation(step.state, view(True, pods("db-1"), ALL))
    assert step.state == HibernationState(P.HIBERNATED, "db-1")
    assert step.statefulset_replicas == 0 and step.pooler_stopped and step.stop == ALL


def test_a_hibernated_cluster_with_no_pod_stays_hibernated() -> None:
    state = HibernationState(P.HIBERNATED, "db-1")
    step = plan_hibernation(state, view(True, []))
    assert step.state == state and step.statefulset_replicas == 0 and step.hibernating


def test_waking_starts_the_recorded_primary_alone_until_it_leads() -> None:
    state = HibernationState(P.HIBERNATED, "db-1")
    step = plan_hibernation(state, view(False, []))
    assert step.state == HibernationState(P.WAKING_PRIMARY, "db-1")
    assert step.statefulset_replicas is None  # spec.replicas again
    assert step.stop == {"db-0", "db-2"} and step.pooler_stopped
    # The pods are back; db-1 runs but does not lead yet (no role label from Patroni).
    starting = [instance_pod(n, "", ready=False) for n in sorted(ALL)]
    step = plan_hibernation(step.state, view(False, starting, frozenset({"db-0", "db-2"})))
    assert step.state.phase is P.WAKING_PRIMARY and "db-1" in step.waiting
    step = plan_hibernation(step.state, view(False, pods("db-1"), frozenset({"db-0", "db-2"})))
    assert step.state == HibernationState(P.AWAKE, "db-1") and not step.hibernating
    assert step.stop == frozenset() and not step.pooler_stopped  # the replicas rejoin now
    assert step.state.to_status() is None


def test_a_replica_that_leads_on_wake_does_not_end_the_wait_for_the_recorded_primary() -> None:
    state = HibernationState(P.WAKING_PRIMARY, "db-1")
    step = plan_hibernation(state, view(False, pods("db-0")))
    assert step.state == state and "db-0" in step.stop and "db-1" not in step.stop


def test_changing_ones_mind_midway_wakes_or_stops_again() -> None:
    stopping = HibernationState(P.STOPPING_REPLICAS, "db-1")
    step = plan_hibernation(stopping, view(False, pods("db-1"), frozenset({"db-0"})))
    assert step.state == HibernationState(P.AWAKE, "db-1")  # the primary still leads: nothing to wait for
    waking = HibernationState(P.WAKING_PRIMARY, "db-1")
    step = plan_hibernation(waking, view(True, pods("db-1")))
    assert step.state == HibernationState(P.STOPPING_REPLICAS, "db-1")


def test_a_cluster_with_no_pods_hibernates_at_once_with_its_last_primary() -> None:
    step = plan_hibernation(HibernationState(), view(True, [], last_primary="db-2"))
    assert step.state == HibernationState(P.HIBERNATED, "db-2") and step.statefulset_replicas == 0


def test_a_major_upgrade_under_way_holds_the_hibernation() -> None:
    step = plan_hibernation(HibernationState(), view(True, pods(), held="the major upgrade to 17 is done"))
    assert step.state.phase is P.AWAKE and not step.hibernating and step.stop == frozenset()
    assert "major upgrade" in step.waiting


def test_a_recorded_primary_scaled_away_lets_patroni_elect_one() -> None:
    step = plan_hibernation(HibernationState(P.HIBERNATED, "db-4"), view(False, []))
    assert step.state.phase is P.AWAKE and step.stop == frozenset()


def test_transitions_outside_the_table_are_refused() -> None:
    with pytest.raises(TransitionRefused, match="Hibernated to StoppingPrimary"):
        HibernationState(P.HIBERNATED, "db-1").to(P.STOPPING_PRIMARY)


def test_the_state_round_trips_through_the_status() -> None:
    state = HibernationState(P.STOPPING_PRIMARY, "db-1")
    assert state.to_status() == {"phase": "StoppingPrimary", "primary": "db-1"}
    assert HibernationState.from_status({"hibernation": state.to_status()}) == state
    assert HibernationState.from_status({"hibernation": {"phase": "Sleeping"}}) == HibernationState()
    assert HibernationState.from_status(None) == HibernationState()


def test_the_pooler_deployments_scale_to_zero_only_while_stopped() -> None:
    children = [{"kind": "Deployment", "spec": {"replicas": 2}}, {"kind": "Service", "spec": {}}]
    assert without_pods(children, False)[0]["spec"]["replicas"] == 2
    assert without_pods(children, True)[0]["spec"]["replicas"] == 0
    assert without_pods(children, True)[1] == {"kind": "Service", "spec": {}}
