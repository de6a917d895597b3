"""The instances sub-reconciler says why an instance pod is stuck: Degraded with the cause, one Warning per
cause (not per pass), cleared once the pod runs, and its precedence over the other sub-reconcilers'
problems (reconcilers/instances.py's docstring)."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.objects import cluster_model
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.instances import InstancesReconciler

IMAGE = "localhost/pg-operator/postgres:16.99-missing"


class RecordedEvents:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    async def record(self, _obj: Any, kind: str, reason: str, message: str) -> bool:
        self.posted.append((kind, reason, message))
        return True


def pod(waiting: str | None, message: str = "") -> dict[str, Any]:
    state = {"waiting": {"reason": waiting, "message": message}} if waiting else {"running": {}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orders-db-0", "namespace": "shop"},
        "spec": {"containers": [{"name": "postgres", "image": IMAGE}]},
        "status": {"phase": "Pending" if waiting else "Running",
                   "containerStatuses": [{"name": "postgres", "restartCount": 0, "state": state}]},
    }  # fmt: skip


def follow_up(
    reconciler: InstancesReconciler, pods: list[dict[str, Any]], reported: tuple[str, str] | None = None
) -> tuple[ReconcileContext, int]:
    body = {"metadata": {"name": "orders-db", "namespace": "shop", "uid": "u"}}
    ctx = ReconcileContext(body, cluster_model(), Snapshot(None, {("v1", "Pod"): pods}), None)
    ctx.report(reported)
    return ctx, asyncio.run(reconciler.follow_up(ctx))


def test_an_image_that_cannot_be_pulled_is_degraded_with_one_warning_until_it_runs() -> None:
    events = RecordedEvents()
    reconciler = InstancesReconciler(events, in_cluster=True)  # type: ignore[arg-type]
    ctx, writes = follow_up(reconciler, [pod("ErrImagePull", "rpc error: not found")])
    assert ctx.problem is not None and ctx.problem[0] == "ImagePullFailed"
    assert (
        f'pod orders-db-0 container postgres cannot pull image "{IMAGE}": rpc error: not found'
        == ctx.problem[1]
    )
    assert writes == 1 and events.posted[0][:2] == ("Warning", "ImagePullFailed")
    back_off = f'Back-off pulling image "{IMAGE}"'
    ctx, writes = follow_up(reconciler, [pod("ImagePullBackOff", back_off)])  # the next pass: same cause
    assert writes == 0 and ctx.problem is not None and back_off in ctx.problem[1]
    ctx, writes = follow_up(reconciler, [pod(None)])
    assert ctx.problem is None and writes == 0
    _, writes = follow_up(reconciler, [pod("ErrImagePull", "again")])  # gone, then back: news again
    assert writes == 1 and len(events.posted) == 2


def test_a_problem_reported_before_wins_but_the_warning_is_posted() -> None:
    events = RecordedEvents()
    reconciler = InstancesReconciler(events, in_cluster=True)  # type: ignore[arg-type]
    missing = (
        "StorageClassNotFound",
        "spec.storageClassName names StorageClass 'fast', which does not exist",
    )
    ctx, writes = follow_up(reconciler, [pod("ErrImagePull", "not found")], missing)
    assert ctx.problem == missing
    assert writes == 1 and events.posted[0][1] == "ImagePullFailed"


def test_a_stuck_pod_says_why_a_rollout_halted() -> None:
    reconciler = InstancesReconciler(RecordedEvents(), in_cluster=True)  # type: ignore[arg-type]
    halted = ("RolloutHalted", "orders-db-0 runs x but is not ready after 400 s; the rollout stopped")
    ctx, _ = follow_up(reconciler, [pod("ImagePullBackOff", "Back-off")], halted)
    assert ctx.problem is not None and ctx.problem[0] == "ImagePullFailed"
    assert ctx.problem[1].endswith("; the rollout is halted")
