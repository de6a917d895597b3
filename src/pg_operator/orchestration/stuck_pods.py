"""Why a pod cannot run, from what the kubelet, the scheduler and the volume controller wrote on the pod and
its claims: an image that cannot be pulled, a container that keeps crashing or cannot be created, a pod
no node can take, a volume claim nothing binds. Pure: pods and PVCs in, typed findings out.

Each finding names the pod (and the container), carries a CamelCase reason for the Degraded condition
and a Warning Event, and the cause in the words of the component that reported it, truncated. Waiting
on the scheduler or a volume is normal for a few seconds while a pod starts: those findings count only
once they last `SCHEDULING_GRACE`; the kubelet's waiting reasons below are failures the moment it
reports them (it retries them with back-off, which is what a stuck pod does).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pg_operator import objects


class StuckReason(enum.StrEnum):
    """What keeps a pod from running: the reason of the Degraded condition and of the Warning Event."""

    IMAGE_PULL_FAILED = "ImagePullFailed"
    CRASH_LOOP = "CrashLoop"
    CONTAINER_CREATE_FAILED = "ContainerCreateFailed"
    UNSCHEDULABLE = "Unschedulable"
    VOLUME_UNBOUND = "VolumeUnbound"


# The kubelet's waiting reasons (a container's state.waiting.reason) and what each one means here.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageInspectError"}
)  # fmt: skip
CRASH_LOOP_REASONS = frozenset({"CrashLoopBackOff"})
CREATE_FAILED_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "PreStartHookError",
     "PostStartHookError"}
)  # fmt: skip
_KUBELET_REASONS: dict[str, StuckReason] = {
    **dict.fromkeys(IMAGE_PULL_REASONS, StuckReason.IMAGE_PULL_FAILED),
    **dict.fromkeys(CRASH_LOOP_REASONS, StuckReason.CRASH_LOOP),
    **dict.fromkeys(CREATE_FAILED_REASONS, StuckReason.CONTAINER_CREATE_FAILED),
}

# How long the scheduler may say Unschedulable, or a claim stay Pending, before it counts: a new pod
# waits a moment for its volume to be provisioned and bound.
SCHEDULING_GRACE = timedelta(seconds=10)
# The component's own message is kept up to this many characters: enough for a container runtime's pull
# error, whose telling part comes last; the pod's own Events carry the rest.
MAX_CAUSE = 600
# A problem message names at most this many stuck pods, then how many more.
MAX_NAMED = 3

# Annotations the volume controller puts on a claim: the external provisioner it waits for, and the node
# the scheduler chose for a claim whose class binds on first use.
PROVISIONER_ANNOTATIONS = (
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
)
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"


@dataclass(frozen=True)
class StuckPod:
    """One pod that cannot run, and why."""

    pod: str
    reason: StuckReason
    cause: str  # the kubelet's, scheduler's or claim's message, truncated
    container: str = ""  # the container the kubelet reports it for, "" for the pod as a whole
    subject: str = ""  # what is stuck beyond the pod: the image, or the volume claim

    @property
    def message(self) -> str:
        where = f"pod {self.pod}" + (f" container {self.container}" if self.container else "")
        if self.reason is StuckReason.IMAGE_PULL_FAILED:
            what = f'cannot pull image "{self.subject}"' if self.subject else "cannot pull its image"
        elif self.reason is StuckReason.CRASH_LOOP:
            what = "keeps crashing"
        elif self.reason is StuckReason.CONTAINER_CREATE_FAILED:
            what = "cannot be started"
        elif self.reason is StuckReason.UNSCHEDULABLE:
            what = "cannot be scheduled"
        else:
            what = f"waits for PersistentVolumeClaim {self.subject} to be bound"
        return f"{where} {what}: {self.cause}" if self.cause else f"{where} {what}"

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """What makes it one cause, for one Warning Event: not the message, which the kubelet rewrites
        at each retry (ErrImagePull, then ImagePullBackOff)."""
        return (self.pod, self.container, self.reason.value, self.subject)


def truncated(text: str, limit: int = MAX_CAUSE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _statuses(pod: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], bool]]:
    """The pod's container statuses, init containers first (one stuck there holds back the rest)."""
    status = objects.status(pod)
    return [(s, True) for s in status.get("initContainerStatuses") or ()] + [
        (s, False) for s in status.get("containerStatuses") or ()
    ]


def _image_of(pod: Mapping[str, Any], container: str, status: Mapping[str, Any]) -> str:
    spec = objects.spec(pod)
    for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if c.get("name") == container and c.get("image"):
            return str(c["image"])
    return str(status.get("image") or "")


def _crash_cause(status: Mapping[str, Any], waiting_message: str) -> str:
    """A crash loop's cause: how its last run ended (exit code, reason, termination message), which
    says more than the back-off message."""
    last = (status.get("lastState") or {}).get("terminated") or {}
    restarts = int(status.get("restartCount") or 0)
    parts = [f"restarted {restarts} time(s)"] if restarts else []
    if last:
        ended = f"last exit code {last.get('exitCode')}"
        if last.get("reason"):
            ended += f" ({last['reason']})"
        parts.append(ended)
        if last.get("message"):
            parts.append(str(last["message"]))
    elif waiting_message:
        parts.append(waiting_message)
    return truncated("; ".join(parts))


def container_stuck(pod: Mapping[str, Any]) -> StuckPod | None:
    """The first container (init containers first) the kubelet reports waiting for a failure."""
    for status, _init in _statuses(pod):
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = _KUBELET_REASONS.get(str(waiting.get("reason") or ""))
        if reason is None:
            continue
        container = str(status.get("name") or "")
        message = str(waiting.get("message") or waiting.get("reason") or "")
        cause = _crash_cause(status, message) if reason is StuckReason.CRASH_LOOP else truncated(message)
        subject = _image_of(pod, container, status) if reason is StuckReason.IMAGE_PULL_FAILED else ""
        return StuckPod(objects.name(pod), reason, cause, container, subject)
    return None


def _since(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def unscheduled(pod: Mapping[str, Any]) -> tuple[str, datetime | None] | None:
    """(the scheduler's message, since when) while the scheduler reports it cannot place the pod."""
    cond = objects.condition(objects.status(pod), "PodScheduled") or {}
    if cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
        return None
    return str(cond.get("message") or ""), _since(cond.get("lastTransitionTime"))


def claim_names(pod: Mapping[str, Any]) -> list[str]:
    """The PersistentVolumeClaims the pod mounts."""
    return [
        str(v["persistentVolumeClaim"]["claimName"])
        for v in objects.spec(pod).get("volumes") or ()
        if (v.get("persistentVolumeClaim") or {}).get("claimName")
    ]


def pending_claim(claim: Mapping[str, Any]) -> bool:
    return objects.status(claim).get("phase") == "Pending" and not objects.deleting(claim)


def claim_cause(claim: Mapping[str, Any]) -> str:
    """What the claim waits for, as far as the claim itself says (its class, the provisioner the volume
    controller handed it to, the node chosen for it)."""
    class_name = objects.spec(claim).get("storageClassName")
    parts = [f'StorageClass "{class_name}"' if class_name else "no StorageClass"]
    provisioner = next((objects.annotation(claim, a) for a in PROVISIONER_ANNOTATIONS
                        if objects.annotation(claim, a)), "")  # fmt: skip
    if provisioner:
        parts.append(f'waiting for provisioner "{provisioner}" to create a volume')
    else:
        parts.append("no provisioner creates a volume for it and no PersistentVolume matches")
    node = objects.annotation(claim, SELECTED_NODE_ANNOTATION)
    if node:
        parts.append(f"for node {node}")
    return ", ".join(parts)


def _mentions_volumes(message: str) -> bool:
    """The scheduler's message blames volumes ("pod has unbound immediate PersistentVolumeClaims",
    "didn't find available persistent volumes to bind", "volume node affinity conflict")."""
    return "volume" in message.lower()


def _lasted(since: datetime | None, now: datetime) -> bool:
    return since is not None and now - since >= SCHEDULING_GRACE


def pod_stuck(
    pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]], now: datetime
) -> StuckPod | None:
    """Why this pod cannot run, or None. `claims`: the namespace's PVCs the caller knows, by name. A
    terminating pod is on its way out: nothing it says counts."""
    if objects.deleting(pod):
        return None
    found = container_stuck(pod)
    if found is not None:
        return found
    name = objects.name(pod)
    pending = [claims[c] for c in claim_names(pod) if c in claims and pending_claim(claims[c])]
    waiting = unscheduled(pod)
    if waiting is not None:
        message, since = waiting
        if not _lasted(since, now):
            return None
        if pending and _mentions_volumes(message):
            claim = pending[0]
            cause = truncated(f"{claim_cause(claim)}; the scheduler says: {message}")
            return StuckPod(name, StuckReason.VOLUME_UNBOUND, cause, subject=objects.name(claim))
        return StuckPod(name, StuckReason.UNSCHEDULABLE, truncated(message))
    for claim in pending:
        if _lasted(_since(objects.meta(claim).get("creationTimestamp")), now):
            return StuckPod(name, StuckReason.VOLUME_UNBOUND, truncated(claim_cause(claim)),
                            subject=objects.name(claim))  # fmt: skip
    return None


def stuck_pods(
    pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], now: datetime
) -> list[StuckPod]:
    """Every pod among `pods` that cannot run, by pod name."""
    by_name = {objects.name(c): c for c in claims}
    found = (pod_stuck(pod, by_name, now) for pod in pods)
    return sorted((f for f in found if f is not None), key=lambda f: f.pod)


def problem(stuck: Sequence[StuckPod]) -> tuple[str, str] | None:
    """(reason, message) for the Degraded condition: the first stuck pod's reason, the message naming
    up to MAX_NAMED of them."""
    if not stuck:
        return None
    named = "; ".join(s.message for s in stuck[:MAX_NAMED])
    more = len(stuck) - MAX_NAMED
    return stuck[0].reason.value, named + (f"; and {more} more pod(s)" if more > 0 else "")


def recheck_in(
    pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], now: datetime
) -> float | None:
    """Seconds until a wait that does not count yet would (an Unschedulable pod, a Pending claim within
    the grace): nothing announces that moment, so the caller looks again then."""
    ends: list[datetime] = []
    by_name = {objects.name(c): c for c in claims}
    for pod in pods:
        if objects.deleting(pod) or container_stuck(pod) is not None:
            continue
        waiting = unscheduled(pod)
        if waiting is not None and waiting[1] is not None:
            ends.append(waiting[1] + SCHEDULING_GRACE)
        for name in claim_names(pod):
            claim = by_name.get(name)
            since = _since(objects.meta(claim).get("creationTimestamp")) if claim else None
            if claim is not None and pending_claim(claim) and since is not None:
                ends.append(since + SCHEDULING_GRACE)
    future = [(end - now).total_seconds() for end in ends if end > now]
    return min(future) + 1.0 if future else None


def stuck_signature(pod: Mapping[str, Any]) -> tuple[Any, ...]:
    """The part of a pod stuck-ness depends on: each container's failing waiting reason and whether the
    scheduler refuses it. Other waiting reasons (ContainerCreating, PodInitializing) are left out, so a
    pod starting normally wakes its cluster no more often than before."""
    failing = tuple(
        (str(s.get("name") or ""), str(((s.get("state") or {}).get("waiting") or {}).get("reason") or ""))
        for s, _ in _statuses(pod)
        if str(((s.get("state") or {}).get("waiting") or {}).get("reason") or "") in _KUBELET_REASONS
    )
    return failing, unscheduled(pod) is not None
