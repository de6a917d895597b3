"""Fencing decisions (pure): which instances are told to stop PostgreSQL now, and whether the primary
hands over first.

An instance is told through instance.yaml (its `fenced` list, api/instance_config.py); its entrypoint stops
Patroni, and with it PostgreSQL, keeps the pod running and answers with the pod annotation
POSTGRES_STOPPED_ANNOTATION (instance/fencing.py). The primary is never stopped while it leads a cluster
that could go on without it: when a healthy replica is not fenced, a switchover to it comes first; when
none is, every other fenced instance stops first and the primary last, so no replica is left running to
win a leader race against data it lacks (writes then stop until it is unfenced).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import FENCED_ANNOTATION, POSTGRES_STOPPED_ANNOTATION, ROLE_PRIMARY
from pg_operator.orchestration.instances import Instance


@dataclass(frozen=True)
class FencePlan:
    fenced: frozenset[str]  # the instances told to stop PostgreSQL now
    switchover_to: str | None = None  # hand the primary over to this replica first
    waiting: str = ""  # what the fencing waits for, for the condition ("" when nothing)


def postgres_stopped(pod: Mapping[str, Any]) -> bool:
    """The instance says its PostgreSQL is stopped because it is fenced (its entrypoint's annotation)."""
    return bool(objects.annotation(pod, POSTGRES_STOPPED_ANNOTATION))


def stopped_instances(pods: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    return frozenset(objects.name(p) for p in pods if postgres_stopped(p) and not objects.deleting(p))


def leading_primary(instances: Sequence[Instance], stopped: frozenset[str]) -> Instance | None:
    """The instance that runs as primary: labelled so by Patroni, not going, PostgreSQL not stopped."""
    return next(
        (i for i in instances if i.role == ROLE_PRIMARY and not i.terminating and i.name not in stopped),
        None,
    )


def plan_fencing(
    requested: frozenset[str], instances: Sequence[Instance], stopped: frozenset[str]
) -> FencePlan:
    """What to fence now for `requested` (spec.fencedInstances expanded), given the instances as observed
    and those whose PostgreSQL is stopped already."""
    primary = leading_primary(instances, stopped)
    if primary is None or primary.name not in requested:
        return FencePlan(requested)
    others = requested - {primary.name}
    candidates = [
        i for i in instances if i.healthy_replica and i.name not in requested and i.name not in stopped
    ]
    if candidates:
        best = min(candidates, key=lambda i: (i.lag, i.ordinal))
        return FencePlan(
            others, best.name, f"{primary.name} hands the primary role over to {best.name} first"
        )
    running = sorted(({i.name for i in instances} & others) - stopped)
    if running:
        return FencePlan(others, None, f"{primary.name} (the primary) stops after {', '.join(running)}")
    return FencePlan(requested)


def fencing_message(requested: frozenset[str], stopped: frozenset[str], waiting: str) -> str:
    """The Fenced condition's message: what is stopped, what is still to stop, and why."""
    done = sorted(requested & stopped)
    pending = sorted(requested - stopped)
    parts = []
    if done:
        parts.append(f"PostgreSQL stopped on {', '.join(done)}")
    if pending:
        parts.append(f"stopping on {', '.join(pending)}")
    if waiting:
        parts.append(waiting)
    return "; ".join(parts)


def marks_to_change(
    pods: Sequence[Mapping[str, Any]], fenced: frozenset[str]
) -> list[tuple[str, str | None]]:
    """(pod, FENCED_ANNOTATION's new value, None to remove it) for each pod whose mark differs from what
    `fenced` says; none for a pod being deleted. Empty when every pod is marked as it should be."""
    out: list[tuple[str, str | None]] = []
    for pod in pods:
        if objects.deleting(pod):
            continue
        want = "true" if objects.name(pod) in fenced else ""  # "": no annotation
        if objects.annotation(pod, FENCED_ANNOTATION) != want:
            out.append((objects.name(pod), want or None))
    return out
