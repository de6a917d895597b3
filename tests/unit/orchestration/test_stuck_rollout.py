"""A rollout replaces at once an outdated instance whose pod cannot start (orchestration/rollout.py): a
cluster created with an image that cannot be pulled recovers when spec.image is fixed, without anyone
deleting the pod by hand."""

from __future__ import annotations

from typing import Any

from harness.pods import NEW_IMAGE, NOW, OLD_IMAGE
from harness.pods import instance_pod as pod
from pg_operator.orchestration.instances import instances_from_pods
from pg_operator.orchestration.rollout import plan_update

MISSING = "localhost/pg-operator/postgres:16.99-missing"


def waiting(p: dict[str, Any], reason: str) -> dict[str, Any]:
    p["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": reason, "message": "x"}}
    return p


def test_a_single_instance_that_cannot_pull_its_image_is_replaced_once_the_image_is_fixed() -> None:
    stuck = waiting(pod("db-0", role="", image=MISSING, ready=False), "ImagePullBackOff")
    action = plan_update(instances_from_pods([stuck]), NEW_IMAGE, 1, NOW)
    assert (action.kind, action.target) == ("delete_pod", "db-0")
    assert "cannot start" in action.reason


def test_a_crash_looping_replica_is_replaced_before_anything_else() -> None:
    pods = [pod("db-0", role="primary"), waiting(pod("db-1", ready=False), "CrashLoopBackOff")]
    action = plan_update(instances_from_pods(pods), NEW_IMAGE, 2, NOW)
    assert (action.kind, action.target) == ("delete_pod", "db-1")


def test_an_instance_that_is_only_starting_is_waited_for() -> None:
    pods = [
        pod("db-0", role="primary"),
        waiting(pod("db-1", image=OLD_IMAGE, ready=False), "ContainerCreating"),
    ]
    action = plan_update(instances_from_pods(pods), NEW_IMAGE, 2, NOW)
    assert action.kind == "wait"


def test_a_terminating_stuck_pod_is_not_deleted_again() -> None:
    gone = waiting(pod("db-0", role="", image=MISSING, ready=False, terminating=True), "ErrImagePull")
    assert plan_update(instances_from_pods([gone]), NEW_IMAGE, 1, NOW).kind != "delete_pod"
