"""The rolling restart `kubectl pgc restart` asks for (orchestration/requested_restart.py): which
instances still wait for it, when it is answered, and how it rides the settings rollout."""

from __future__ import annotations

from typing import Any

from pg_operator.orchestration.instances import instances_from_pods, parse_members
from pg_operator.orchestration.requested_restart import (
    REQUESTED,
    RESTARTED_FOR_ANNOTATION,
    is_requested,
    restart_answered,
    restarted_patch,
    with_requested_restart,
)
from pg_operator.orchestration.rollout import plan_restart

TOKEN = "2026-12-02T12:00:00Z"


def pod(name: str, role: str, restarted_for: str | None = None, pending: bool = False) -> dict[str, Any]:
    annotations = {
        "status": '{"state": "running", "pending_restart": true}' if pending else '{"state": "running"}'
    }
    if restarted_for:
        annotations[RESTARTED_FOR_ANNOTATION] = restarted_for
    return {
        "metadata": {"name": name, "labels": {"role": role}, "annotations": annotations},
        "spec": {"containers": [{"name": "postgres", "image": "pg:16"}]},
        "status": {
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "postgres", "state": {"running": {}}, "restartCount": 0}],
        },
    }


def test_instances_not_yet_restarted_for_the_token_wait_for_it() -> None:
    pods = [pod("db-0", "primary"), pod("db-1", "replica", TOKEN), pod("db-2", "replica", "older")]
    marked = {i.name: i for i in with_requested_restart(instances_from_pods(pods), pods, TOKEN)}
    assert marked["db-0"].pending_restart == (REQUESTED,) and is_requested(marked["db-0"])
    assert marked["db-1"].pending_restart is None and not is_requested(marked["db-1"])
    assert marked["db-2"].pending_restart == (REQUESTED,)


def test_settings_patroni_waits_for_are_kept_beside_the_request() -> None:
    pods = [pod("db-0", "primary", pending=True)]
    marked = with_requested_restart(instances_from_pods(pods), pods, TOKEN)
    assert marked[0].pending_restart == (REQUESTED,)  # Patroni named no setting: () then the request
    again = with_requested_restart(marked, pods, TOKEN)
    assert again == marked  # marking twice changes nothing


def test_answered_once_every_instance_carries_the_token() -> None:
    pods = [pod("db-0", "primary", TOKEN), pod("db-1", "replica", TOKEN)]
    assert restart_answered(instances_from_pods(pods), pods, TOKEN)
    assert not restart_answered(instances_from_pods(pods), pods, "2026-12-02T13:00:00Z")  # a new request
    pods[1] = pod("db-1", "replica")
    assert not restart_answered(instances_from_pods(pods), pods, TOKEN)
    assert not restart_answered([], [], TOKEN)


def test_the_rollout_restarts_replicas_first_then_the_primary_in_place() -> None:
    # Patroni's GET /cluster: both replicas streaming and caught up (the rollout waits otherwise).
    members = parse_members(
        {
            "members": [
                {"name": "db-0", "role": "leader", "state": "running", "timeline": 1},
                {"name": "db-1", "role": "replica", "state": "streaming", "timeline": 1, "lag": 0},
                {"name": "db-2", "role": "replica", "state": "streaming", "timeline": 1, "lag": 0},
            ]
        }
    )
    pods = [pod("db-0", "primary"), pod("db-1", "replica"), pod("db-2", "replica")]
    first = plan_restart(with_requested_restart(instances_from_pods(pods, members), pods, TOKEN), 3)
    assert (first.kind, first.target) == ("restart", "db-2") and REQUESTED in first.reason
    pods = [pod("db-0", "primary"), pod("db-1", "replica", TOKEN), pod("db-2", "replica", TOKEN)]
    last = plan_restart(with_requested_restart(instances_from_pods(pods, members), pods, TOKEN), 3)
    assert (last.kind, last.target) == ("restart", "db-0") and "in place" in last.reason


def test_the_pod_mark_is_a_merge_patch_of_one_annotation() -> None:
    assert restarted_patch(TOKEN) == {"metadata": {"annotations": {RESTARTED_FOR_ANNOTATION: TOKEN}}}
