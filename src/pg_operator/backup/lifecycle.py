"""What a Backup's next step is, from its status and what the operator sees (pure).

Phases: Pending (waiting for a fit instance) → Running (the command started in `status.instance`) →
Completed or Failed. A Backup ends only once; a finished one is never run again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pg_operator import objects
from pg_operator.backup.failures import classify
from pg_operator.backup.jobs import JobState
from pg_operator.backup.placement import Placement

TERMINAL = ("Completed", "Failed")
POLL_SECONDS = 10.0
PENDING_RETRY_SECONDS = 15.0

StepKind = Literal["done", "fail", "wait", "start", "poll", "collect"]


@dataclass(frozen=True)
class Step:
    kind: StepKind
    status: dict[str, Any] = field(default_factory=dict)  # fields to merge into .status
    reason: str = ""
    message: str = ""
    requeue: float | None = None
    pod: str | None = None


def error_text(reason: str, message: str) -> str:
    """status.error carries the reason first, so conditions can be derived from the Backup alone."""
    return f"{reason}: {message}"


def reason_of(error: str | None) -> str:
    head, sep, _ = (error or "").partition(": ")
    return head if sep and head.isidentifier() else "BackupFailed"


def _failed(reason: str, message: str, stamp: str) -> Step:
    return Step(
        "fail",
        {"phase": "Failed", "error": error_text(reason, message), "stoppedAt": stamp},
        reason,
        message,
    )


def before_start(
    status: Mapping[str, Any],
    *,
    cluster: Mapping[str, Any] | None,
    placement: Placement | None,
    now_stamp: str,
) -> Step:
    """For a Backup that is not Running yet: fail it, keep it Pending, or start it on an instance."""
    phase = status.get("phase")
    if phase in TERMINAL:
        return Step("done")
    if phase == "Running":
        return Step("poll", pod=str(status.get("instance") or ""))
    if cluster is None:
        message = "the PostgresCluster named in spec.cluster does not exist"
        return _failed("ClusterNotFound", message, now_stamp)
    if not objects.spec(cluster).get("backup"):
        return _failed("BackupNotConfigured", "the cluster has no spec.backup (object store)", now_stamp)
    if objects.deleting(cluster):
        return _failed("ClusterDeleted", "the cluster is being deleted", now_stamp)
    if placement is None:
        message = "waiting for a ready instance of the cluster"
        return Step("wait", {"phase": "Pending", "error": message}, "NoReadyInstance", message,
                    requeue=PENDING_RETRY_SECONDS)  # fmt: skip
    return Step(
        "start",
        {"phase": "Running", "instance": placement.pod, "startedAt": now_stamp, "error": None},
        "Started",
        f"base backup started on {placement.pod} ({placement.reason})",
        pod=placement.pod,
    )


def after_poll(job: JobState, *, now_stamp: str, secrets: tuple[str, ...] = ()) -> Step:
    """For a Running Backup, from the state of its job in the pod."""
    if job.phase == "running":
        return Step("wait", requeue=POLL_SECONDS)
    if job.phase == "absent":
        # Running was recorded but the command never started (the operator stopped in between).
        return Step("start")
    if job.phase == "lost":
        return _failed(
            "BackupInterrupted",
            "the backup process is gone without an exit status (its container restarted)",
            now_stamp,
        )
    if job.exit_status == 0:
        return Step("collect")
    failure = classify(job.exit_status or 1, job.output, secrets=secrets)
    return _failed(failure.reason, failure.message, now_stamp)
