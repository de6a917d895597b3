"""`kubectl pgc status` says why a pod cannot run, from the pod itself (even while the Degraded condition
names another problem)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pg_operator.cli.pgc.status import render, summarize

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
IMAGE = "localhost/pg-operator/postgres:16.99-missing"


def stuck_pod() -> dict[str, Any]:
    back_off = f'Back-off pulling image "{IMAGE}": ErrImagePull: connection refused'
    return {
        "metadata": {"name": "db-0", "creationTimestamp": "2026-12-02T11:59:00Z"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "postgres", "image": IMAGE}]},
        "status": {"conditions": [{"type": "Ready", "status": "False"}],
                   "containerStatuses": [{"name": "postgres", "restartCount": 0,
                                          "state": {"waiting": {"reason": "ImagePullBackOff",
                                                                "message": back_off}}}]},
    }  # fmt: skip


def cluster() -> dict[str, Any]:
    degraded = {"type": "Degraded", "status": "True", "reason": "ImagePullFailed",
                "message": f'pod db-0 container postgres cannot pull image "{IMAGE}"',
                "lastTransitionTime": "2026-12-02T11:59:30Z"}  # fmt: skip
    return {
        "metadata": {"name": "db", "namespace": "shop", "generation": 1},
        "spec": {"replicas": 1, "version": "16", "image": IMAGE},
        "status": {"phase": "Degraded: ImagePullFailed", "observedGeneration": 1, "conditions": [degraded]},
    }


def test_a_pod_that_cannot_pull_its_image_is_shown_with_its_cause() -> None:
    summary = summarize(cluster(), [stuck_pod()], NOW)
    assert [(s["pod"], s["container"], s["reason"]) for s in summary["stuck"]] == [
        ("db-0", "postgres", "ImagePullFailed")
    ]
    screen = render(summary)
    stuck = next(line for line in screen.splitlines() if line.startswith("Stuck"))
    assert stuck.startswith(
        f'Stuck      ImagePullFailed: pod db-0 container postgres cannot pull image "{IMAGE}"'
    )
    assert "connection refused" in stuck
    assert any(line.split()[:3] == ["Degraded", "True", "ImagePullFailed"] for line in screen.splitlines())


def test_nothing_stuck_shows_no_line() -> None:
    running = stuck_pod()
    running["status"]["containerStatuses"][0]["state"] = {"running": {}}
    summary = summarize(cluster(), [running], NOW)
    assert summary["stuck"] == [] and "Stuck" not in render(summary)
