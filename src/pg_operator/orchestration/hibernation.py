"""Hibernation as a workflow over reconciles (pure): typed state, kept in `status.hibernation`, that moves
only through TRANSITIONS.

    Awake ──spec true──▶ StoppingReplicas ──replicas stopped──▶ StoppingPrimary ──all stopped──▶ Hibernated
      ▲                        │ spec false                       │ spec false                  │ spec false
      └──primary leads── WakingPrimary ◀──────────────────────────┴─────────────────────────────┘

- Stopping: the primary is recorded first; PostgreSQL stops on the replicas (fenced through instance.yaml,
  orchestration/fencing.py), then on the primary. No Patroni runs on a replica by the time the primary
  stops, so none can take its place: its shutdown checkpoint is the last record and it stays the one
  with every write. Only then is the StatefulSet scaled to 0; the pooler's Deployment is scaled to 0
  from the start, so clients stop first.
- Waking: the StatefulSet gets its size back with every instance but the recorded primary still fenced;
  once that one leads again, the others are unfenced and stream from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from pg_operator.api.constants import ROLE_PRIMARY
from pg_operator.orchestration.fencing import leading_primary
from pg_operator.orchestration.instances import Instance


class HibernationPhase(StrEnum):
    AWAKE = "Awake"  # nothing in progress; never stored (status.hibernation is absent)
    STOPPING_REPLICAS = "StoppingReplicas"
    STOPPING_PRIMARY = "StoppingPrimary"
    HIBERNATED = "Hibernated"
    WAKING_PRIMARY = "WakingPrimary"


P = HibernationPhase
TRANSITIONS: Mapping[HibernationPhase, frozenset[HibernationPhase]] = {
    P.AWAKE: frozenset({P.STOPPING_REPLICAS, P.HIBERNATED}),
    P.STOPPING_REPLICAS: frozenset({P.STOPPING_PRIMARY, P.WAKING_PRIMARY}),
    P.STOPPING_PRIMARY: frozenset({P.HIBERNATED, P.WAKING_PRIMARY}),
    P.HIBERNATED: frozenset({P.WAKING_PRIMARY}),
    P.WAKING_PRIMARY: frozenset({P.AWAKE, P.STOPPING_REPLICAS}),
}


class TransitionRefused(ValueError):
    pass


@dataclass(frozen=True)
class HibernationState:
    phase: HibernationPhase = P.AWAKE
    primary: str | None = None  # the instance that was primary when the cluster stopped

    def to(self, phase: HibernationPhase, primary: str | None = None) -> HibernationState:
        if phase not in TRANSITIONS[self.phase]:
            raise TransitionRefused(f"hibernation: no transition from {self.phase} to {phase}")
        return replace(self, phase=phase, primary=self.primary if primary is None else primary)

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> HibernationState:
        section = (status or {}).get("hibernation")
        if not isinstance(section, Mapping):
            return cls()
        try:
            phase = HibernationPhase(str(section.get("phase")))
        except ValueError:
            return cls()
        return cls(phase, str(section["primary"]) if section.get("primary") else None)

    def to_status(self) -> dict[str, Any] | None:
        if self.phase is P.AWAKE:
            return None
        return {"phase": self.phase.value, **({"primary": self.primary} if self.primary else {})}


@dataclass(frozen=True)
class ClusterView:
    """What a hibernation decision reads of the cluster."""

    name: str
    replicas: int  # spec.replicas
    wanted: bool  # spec.hibernation
    instances: Sequence[Instance]  # the instance pods that exist
    stopped: frozenset[str]  # instances whose PostgreSQL says it is stopped (fencing's annotation)
    last_primary: str = ""  # status.currentPrimary as last reported
    held: str = ""  # why a hibernation may not begin now (a major upgrade under way), "" when it may

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f"{self.name}-{i}" for i in range(self.replicas)) | {i.name for i in self.instances}

    def down(self, name: str) -> bool:
        """PostgreSQL does not run there: its pod is gone, its container is down, or it says it stopped."""
        found = next((i for i in self.instances if i.name == name), None)
        return found is None or found.container_down or name in self.stopped


@dataclass(frozen=True)
class HibernationStep:
    state: HibernationState
    stop: frozenset[str] = frozenset()  # instances whose PostgreSQL must be stopped for the hibernation
    statefulset_replicas: int | None = None  # the StatefulSet's size instead of spec.replicas
    pooler_stopped: bool = False
    waiting: str = ""  # what the step waits for, for the status

    @property
    def hibernating(self) -> bool:
        """A hibernation or a wake is under way or done: the rest of the reconcile stands aside."""
        return self.state.phase is not P.AWAKE


def plan_hibernation(state: HibernationState, view: ClusterView) -> HibernationStep:
    """This reconcile's step; a phase whose wait is over moves on at once (at most once per phase)."""
    for _ in TRANSITIONS:
        step = _step(state, view)
        if step.state == state:
            return step
        state = step.state
    return _step(state, view)


def _step(state: HibernationState, view: ClusterView) -> HibernationStep:
    return _PHASE_STEPS[state.phase](state, view)


def _awake(state: HibernationState, view: ClusterView) -> HibernationStep:
    if not view.wanted:
        return HibernationStep(state)
    if view.held:
        return HibernationStep(state, waiting=f"the hibernation begins once {view.held}")
    if not view.instances:  # nothing runs: nothing to stop
        return HibernationStep(state.to(P.HIBERNATED, view.last_primary or None))
    leader = leading_primary(view.instances, view.stopped)
    return HibernationStep(state.to(P.STOPPING_REPLICAS, leader.name if leader else view.last_primary))


def _stopping_replicas(state: HibernationState, view: ClusterView) -> HibernationStep:
    if not view.wanted:
        return HibernationStep(state.to(P.WAKING_PRIMARY))
    replicas = view.names - {state.primary or ""}
    running = sorted(n for n in replicas if not view.down(n))
    if not running or not state.primary:
        return HibernationStep(state.to(P.STOPPING_PRIMARY))
    waiting = f"stopping PostgreSQL on the replicas {', '.join(running)}"
    return HibernationStep(state, replicas, pooler_stopped=True, waiting=waiting)


def _stopping_primary(state: HibernationState, view: ClusterView) -> HibernationStep:
    if not view.wanted:
        return HibernationStep(state.to(P.WAKING_PRIMARY))
    running = sorted(n for n in view.names if not view.down(n))
    if not running:
        return HibernationStep(state.to(P.HIBERNATED))
    waiting = f"stopping PostgreSQL on {', '.join(running)}"
    return HibernationStep(state, view.names, pooler_stopped=True, waiting=waiting)


def _hibernated(state: HibernationState, view: ClusterView) -> HibernationStep:
    if not view.wanted:
        return HibernationStep(state.to(P.WAKING_PRIMARY))
    return HibernationStep(state, view.names, statefulset_replicas=0, pooler_stopped=True)


def _waking_primary(state: HibernationState, view: ClusterView) -> HibernationStep:
    if view.wanted:
        return HibernationStep(state.to(P.STOPPING_REPLICAS))
    primary = state.primary
    if not primary or primary not in {f"{view.name}-{i}" for i in range(view.replicas)}:
        return HibernationStep(state.to(P.AWAKE))  # no primary recorded, or scaled away: Patroni elects one
    if _leads(view.instances, primary, view.stopped):
        return HibernationStep(state.to(P.AWAKE))
    waiting = f"starting {primary}, the primary before the hibernation, first"
    return HibernationStep(state, view.names - {primary}, pooler_stopped=True, waiting=waiting)


_PHASE_STEPS = {
    P.AWAKE: _awake,
    P.STOPPING_REPLICAS: _stopping_replicas,
    P.STOPPING_PRIMARY: _stopping_primary,
    P.HIBERNATED: _hibernated,
    P.WAKING_PRIMARY: _waking_primary,
}


def _leads(instances: Sequence[Instance], name: str, stopped: frozenset[str]) -> bool:
    return any(
        i.name == name and i.role == ROLE_PRIMARY and i.ready and not i.terminating and name not in stopped
        for i in instances
    )


def without_pods(children: list[dict[str, Any]], stopped: bool) -> list[dict[str, Any]]:
    """The pooler's children as they are, or with each Deployment scaled to 0 while the cluster hibernates."""
    if stopped:
        for child in children:
            if child["kind"] == "Deployment":
                child["spec"]["replicas"] = 0
    return children
