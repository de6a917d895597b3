"""A settings restart that an instance does not come back from stops the rollout, and says which
instance, which settings, and that the primary keeps serving."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pg_operator.orchestration.instances import instances_from_pods, parse_members
from pg_operator.orchestration.rollout import RESTART_STALL_AFTER, plan_restart

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
MAX_CONN = {"max_connections": {"old_value": "100", "new_value": "200000"}}


def pod(
    name: str,
    role: str,
    *,
    pending: dict[str, Any] | None = None,
    ready: bool = True,
    state: str = "running",
    not_ready_for: timedelta = timedelta(0),
) -> dict[str, Any]:
    patroni: dict[str, Any] = {"role": role, "state": state}
    if pending is not None:
        patroni.update(pending_restart=True, pending_restart_reason=pending)
    ready_cond: dict[str, Any] = {
        "type": "Ready",
        "status": "True" if ready else "False",
        "lastTransitionTime": (NOW - not_ready_for).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    return {
        "metadata": {
            "name": name,
            "labels": {"role": role},
            "annotations": {"status": json.dumps(patroni)},
            "creationTimestamp": "2026-12-01T10:00:00Z",
        },
        "spec": {"containers": [{"name": "postgres", "image": "img"}]},
        "status": {
            "conditions": [ready_cond],
            "containerStatuses": [{"name": "postgres", "state": {"running": {}}, "restartCount": 0}],
            "podIP": "10.0.0.1",
        },
    }


def members(replica_state: str) -> Any:
    return parse_members(
        {
            "members": [
                {"name": "db-0", "role": "leader", "state": "running", "lag": 0},
                {"name": "db-1", "role": "replica", "state": "streaming", "lag": 0},
                {"name": "db-2", "role": "replica", "state": replica_state, "lag": "unknown"},
            ]
        }
    )


def test_a_replica_that_patroni_cannot_start_halts_the_rollout_naming_instance_and_setting() -> None:
    pods = [
        pod("db-0", "primary", pending=MAX_CONN),
        pod("db-1", "replica", pending=MAX_CONN),
        pod("db-2", "replica", ready=False, state="start failed"),
    ]
    action = plan_restart(instances_from_pods(pods, members("start failed")), 3, now=NOW)
    assert (action.kind, action.target) == ("halt", "db-2")
    assert action.reason.startswith("db-2 does not start (Patroni: start failed) while max_connections waits")
    assert "stopped at db-2" in action.reason
    assert "primary db-0 keeps serving with the previous value" in action.reason
    assert "set spec.postgresql.parameters max_connections back" in action.reason


def test_patronis_state_from_the_pod_annotation_is_enough() -> None:
    pods = [
        pod("db-0", "primary", pending=MAX_CONN),
        pod("db-1", "replica", pending=MAX_CONN),
        pod("db-2", "replica", ready=False, state="crashed"),
    ]
    action = plan_restart(instances_from_pods(pods), 3, now=NOW)
    assert (action.kind, action.target) == ("halt", "db-2") and "Patroni: crashed" in action.reason
    pods[2] = pod("db-2", "replica", ready=False, state="restart failed (running)")
    action = plan_restart(instances_from_pods(pods), 3, now=NOW)
    assert action.kind == "halt" and "Patroni: restart failed (running)" in action.reason


def test_a_restart_in_progress_is_waited_for_then_halts_when_it_stalls() -> None:
    starting = [
        pod("db-0", "primary", pending=MAX_CONN),
        pod("db-1", "replica", pending=MAX_CONN),
        pod("db-2", "replica", ready=False, state="starting", not_ready_for=timedelta(seconds=5)),
    ]
    action = plan_restart(instances_from_pods(starting, members("starting")), 3, now=NOW)
    assert action.kind == "wait" and "db-2" in action.reason
    starting[2] = pod(
        "db-2",
        "replica",
        ready=False,
        state="starting",
        not_ready_for=RESTART_STALL_AFTER + timedelta(seconds=1),
    )
    action = plan_restart(instances_from_pods(starting, members("starting")), 3, now=NOW)
    assert (action.kind, action.target) == ("halt", "db-2") and "Patroni: starting" in action.reason


def test_no_halt_without_a_settings_restart_and_none_once_it_healed() -> None:
    # Nothing waits for a restart: a down replica is someone else's business (no settings rollout).
    down = [
        pod("db-0", "primary"),
        pod("db-1", "replica"),
        pod("db-2", "replica", ready=False, state="start failed"),
    ]
    assert plan_restart(instances_from_pods(down), 3, now=NOW).kind == "none"
    # The spec set back: Patroni starts db-2 with the old value and nothing waits any more.
    healed = [pod("db-0", "primary"), pod("db-1", "replica"), pod("db-2", "replica")]
    assert plan_restart(instances_from_pods(healed, members("streaming")), 3, now=NOW).kind == "none"


def test_several_settings_are_all_named() -> None:
    both = {**MAX_CONN, "shared_buffers": {"old_value": "128MB", "new_value": "64GB"}}
    pods = [pod("db-0", "primary", pending=both), pod("db-1", "replica", ready=False, state="start failed")]
    action = plan_restart(instances_from_pods(pods), 2, now=NOW)
    assert action.kind == "halt" and "max_connections, shared_buffers wait for a restart" in action.reason
