"""A pod getting stuck wakes its cluster (controller/wakeups.py): its phase and readiness do not move when
the kubelet starts failing to pull its image or the scheduler refuses it, so the failure itself must."""

from __future__ import annotations

from typing import Any

from pg_operator.controller.wakeups import relevance


def pod(waiting: str | None = None, unschedulable: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    if waiting is not None:
        status["containerStatuses"] = [{"name": "postgres", "state": {"waiting": {"reason": waiting}}}]
    if unschedulable:
        status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    return {"kind": "Pod", "metadata": {"name": "db-0"}, "status": status}


def test_a_failing_container_or_a_refusing_scheduler_wakes_the_cluster() -> None:
    creating = relevance(pod("ContainerCreating"))
    assert relevance(pod("ErrImagePull")) != creating
    assert relevance(pod("ImagePullBackOff")) != relevance(pod("ErrImagePull"))
    assert relevance(pod("CrashLoopBackOff")) != creating
    assert relevance(pod(unschedulable=True)) != relevance(pod())


def test_a_normal_start_does_not_wake_it_more_often() -> None:
    assert relevance(pod("ContainerCreating")) == relevance(pod("PodInitializing")) == relevance(pod())
