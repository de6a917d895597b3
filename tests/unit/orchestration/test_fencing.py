"""Fencing decisions (pure): a fenced replica stops at once; a fenced primary hands over to a healthy
replica first, and with none it stops after every other fenced instance."""

from __future__ import annotations

from harness.pods import instance_pod
from pg_operator.api.constants import FENCED_ANNOTATION, POSTGRES_STOPPED_ANNOTATION
from pg_operator.orchestration.fencing import (
    fencing_message,
    marks_to_change,
    plan_fencing,
    stopped_instances,
)
from pg_operator.orchestration.instances import instances_from_pods

PODS = [instance_pod("db-0", "primary"), instance_pod("db-1"), instance_pod("db-2")]
INSTANCES = instances_from_pods(PODS)


def test_a_fenced_replica_is_told_at_once() -> None:
    plan = plan_fencing(frozenset({"db-2"}), INSTANCES, frozenset())
    assert plan.fenced == {"db-2"} and plan.switchover_to is None and plan.waiting == ""


def test_a_fenced_primary_hands_over_to_a_healthy_replica_first() -> None:
    plan = plan_fencing(frozenset({"db-0"}), INSTANCES, frozenset())
    assert plan.fenced == frozenset() and plan.switchover_to == "db-1"
    assert "db-0 hands the primary role over to db-1" in plan.waiting


def test_the_candidate_is_never_a_fenced_or_unready_replica() -> None:
    pods = [instance_pod("db-0", "primary"), instance_pod("db-1", ready=False), instance_pod("db-2")]
    plan = plan_fencing(frozenset({"db-0"}), instances_from_pods(pods), frozenset())
    assert plan.switchover_to == "db-2"
    plan = plan_fencing(frozenset({"db-0", "db-2"}), instances_from_pods(pods), frozenset())
    assert plan.switchover_to is None  # no healthy replica left: the others stop first
    assert plan.fenced == {"db-2"} and "db-0 (the primary) stops after db-2" in plan.waiting


def test_every_instance_fenced_stops_the_primary_last() -> None:
    plan = plan_fencing(frozenset({"db-0", "db-1", "db-2"}), INSTANCES, frozenset({"db-1"}))
    assert plan.fenced == {"db-1", "db-2"} and plan.switchover_to is None
    plan = plan_fencing(frozenset({"db-0", "db-1", "db-2"}), INSTANCES, frozenset({"db-1", "db-2"}))
    assert plan.fenced == {"db-0", "db-1", "db-2"} and plan.waiting == ""


def test_after_the_handover_the_old_primary_is_fenced() -> None:
    pods = [instance_pod("db-0"), instance_pod("db-1", "primary"), instance_pod("db-2")]
    plan = plan_fencing(frozenset({"db-0"}), instances_from_pods(pods), frozenset())
    assert plan.fenced == {"db-0"} and plan.switchover_to is None


def test_stopped_instances_are_those_whose_entrypoint_says_so() -> None:
    stopped = instance_pod("db-1")
    stopped["metadata"]["annotations"] = {POSTGRES_STOPPED_ANNOTATION: "2026-12-01T12:00:00Z"}
    assert stopped_instances([stopped, instance_pod("db-2")]) == {"db-1"}


def test_the_message_says_what_stopped_and_what_waits() -> None:
    message = fencing_message(frozenset({"db-0", "db-1"}), frozenset({"db-1"}), "db-0 hands over first")
    assert message == "PostgreSQL stopped on db-1; stopping on db-0; db-0 hands over first"


def test_only_pods_whose_mark_differs_are_patched() -> None:
    marked = instance_pod("db-1")
    marked["metadata"]["annotations"] = {FENCED_ANNOTATION: "true"}
    going = instance_pod("db-2", terminating=True)
    pods = [instance_pod("db-0"), marked, going]
    assert marks_to_change(pods, frozenset()) == [("db-1", None)]
    assert marks_to_change(pods, frozenset({"db-1"})) == []  # a steady state patches nothing
    assert marks_to_change(pods, frozenset({"db-0", "db-1", "db-2"})) == [("db-0", "true")]
