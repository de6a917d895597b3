"""The lifecycle sub-reconciler: spec.hibernation and spec.fencedInstances (docs/lifecycle.md).

It runs first, so every other sub-reconciler knows what is stopped on purpose before it acts:

- `act`: the hibernation's step (orchestration/hibernation.py, its state in `status.hibernation`) and the
  fencing plan (orchestration/fencing.py) decide which instances are told to stop PostgreSQL
  (`ctx.fenced`, written into instance.yaml by the instances sub-reconciler), the StatefulSet's size
  (`ctx.replicas`, 0 once hibernated) and whether the pooler runs (`ctx.pooler_stopped`). A fenced primary
  is handed over to a healthy replica first, through the high-availability sub-reconciler's switchover
  (the pooler paused around it).
- `follow_up`: once instance.yaml says it, each instance pod whose fencing changed is marked (or
  unmarked) with FENCED_ANNOTATION: a pod update makes the kubelet refresh the pod's mounted files at once
  instead of at its next periodic sync, so the entrypoint sees the new list within seconds.
- `status`: `status.hibernation`, `status.fencedInstances`, the `Hibernated` and `Fenced` conditions, and
  the phase while a hibernation or a wake is under way; a hibernated cluster is neither Ready nor Degraded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, FENCED_ANNOTATION
from pg_operator.api.lifecycle import fenced_names
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, is_not_found, resource_for
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.orchestration import major_upgrade_state as mus
from pg_operator.orchestration.fencing import (
    FencePlan,
    fencing_message,
    marks_to_change,
    plan_fencing,
    stopped_instances,
)
from pg_operator.orchestration.hibernation import (
    ClusterView,
    HibernationPhase,
    HibernationState,
    HibernationStep,
    plan_hibernation,
)
from pg_operator.orchestration.instances import instances_from_pods

log = logging.getLogger(__name__)

# While PostgreSQL stops or starts on an instance, look again this often: the pods' annotations wake the
# cluster, but a Patroni leading again after a wake changes only what the next probe says.
RECHECK_SECONDS = 3.0
# A switchover asked for a fenced primary is not asked again for this long: the cache may still show the
# old primary's label for a moment after Patroni answered.
HANDOVER_QUIET_SECONDS = 30.0

P = HibernationPhase
PHASE_WORDS = {
    P.STOPPING_REPLICAS: "Hibernating: stopping the replicas",
    P.STOPPING_PRIMARY: "Hibernating: stopping the primary",
    P.HIBERNATED: "Hibernated",
    P.WAKING_PRIMARY: "Waking: starting the primary",
}
EVENTS = {
    P.STOPPING_REPLICAS: "Hibernating",
    P.STOPPING_PRIMARY: "Hibernating",
    P.HIBERNATED: "Hibernated",
    P.WAKING_PRIMARY: "Waking",
    P.AWAKE: "Awake",
}


@dataclass
class Remembered:
    """This reconcile's decisions for `status`, and the switchover asked for a fenced primary."""

    step: HibernationStep = field(default_factory=lambda: HibernationStep(HibernationState()))
    plan: FencePlan = field(default_factory=lambda: FencePlan(frozenset()))
    requested: frozenset[str] = frozenset()
    stopped: frozenset[str] = frozenset()
    handed_over_at: dict[str, float] = field(default_factory=dict)  # primary → when its switchover was asked
    # The phase last told by an Event: a reconcile that reads a status not yet showing the move (its write
    # still on the way) makes the same move again, and must not tell it twice.
    told: HibernationPhase | None = None


def cluster_pods(ctx: ReconcileContext) -> list[dict[str, Any]]:
    return [p for p in ctx.snapshot.of_kind("v1", "Pod") if objects.label(p, CLUSTER_LABEL) == ctx.name]


def upgrade_under_way(body: Mapping[str, Any]) -> str:
    """ "" unless a major upgrade has begun and not settled (a hibernation waits for it)."""
    try:
        state = mus.UpgradeState.from_annotation(body)
    except ValueError:
        return ""
    if state is None or state.phase in mus.SETTLED:
        return ""
    return f"the major upgrade to {state.new_major} is done"


class HandsOver(Protocol):
    """The high-availability sub-reconciler's planned switchover (reconcilers/high_availability.py)."""

    async def hand_over(self, ctx: ReconcileContext, target: str, reason: str) -> bool: ...


class LifecycleReconciler(SubReconciler):
    def __init__(self, api: Api, events: EventRecorder, high_availability: HandsOver) -> None:
        self.api = api
        self.events = events
        self.ha = high_availability
        self._memory: ClusterMemory[Remembered] = ClusterMemory(Remembered)

    async def act(self, ctx: ReconcileContext) -> None:
        spec = ctx.cluster.spec
        pods = cluster_pods(ctx)
        instances = instances_from_pods(pods)
        stopped = stopped_instances(pods)
        previous = ctx.body.get("status") or {}
        state = HibernationState.from_status(previous)
        last_primary = str(previous.get("currentPrimary") or "")
        view = ClusterView(ctx.name, spec.replicas, spec.hibernation, instances, stopped, last_primary,
                           upgrade_under_way(ctx.body))  # fmt: skip
        step = plan_hibernation(state, view)
        requested = fenced_names(ctx.name, spec.replicas, spec.fenced_instances)
        memory = self._memory.of(ctx.key)
        plan = FencePlan(frozenset())
        if step.state.phase in (P.STOPPING_REPLICAS, P.STOPPING_PRIMARY, P.HIBERNATED):
            fenced = step.stop  # the hibernation's order, whatever is fenced besides
        else:
            plan = plan_fencing(requested, instances, stopped)
            fenced = plan.fenced | step.stop
            if plan.switchover_to is not None and not step.hibernating:
                await self._hand_over(ctx, memory, plan.switchover_to)
        ctx.fenced, ctx.hibernating, ctx.pooler_stopped = fenced, step.hibernating, step.pooler_stopped
        if step.statefulset_replicas is not None:
            ctx.replicas = step.statefulset_replicas
        if step.waiting or plan.waiting or (fenced - stopped) & {i.name for i in instances}:
            ctx.again_in(RECHECK_SECONDS)
        if step.state.phase is not state.phase and step.state.phase is not memory.told:
            memory.told = step.state.phase
            log.info("%s/%s: hibernation %s -> %s", ctx.namespace, ctx.name, state.phase, step.state.phase)
            message = PHASE_WORDS.get(step.state.phase, "the cluster runs again")
            if step.state.primary:
                message += f" (primary {step.state.primary})"
            ctx.writes += int(await self.events.record(ctx.body, "Normal", EVENTS[step.state.phase], message))
        memory.step, memory.plan, memory.requested, memory.stopped = step, plan, requested, stopped

    async def _hand_over(self, ctx: ReconcileContext, memory: Remembered, target: str) -> None:
        primary = next(
            (objects.name(p) for p in cluster_pods(ctx) if objects.label(p, "role") == "primary"), ""
        )
        asked = memory.handed_over_at.get(primary)
        if asked is not None and time.monotonic() - asked < HANDOVER_QUIET_SECONDS:
            return
        reason = f"{primary} is fenced: switching over to {target} before its PostgreSQL stops"
        if await self.ha.hand_over(ctx, target, reason):
            memory.handed_over_at[primary] = time.monotonic()

    async def follow_up(self, ctx: ReconcileContext) -> int:
        """Mark the pods whose fencing changed, now that instance.yaml says it (the module's docstring)."""
        writes = 0
        for name, value in marks_to_change(cluster_pods(ctx), ctx.fenced):
            patch = {"metadata": {"annotations": {FENCED_ANNOTATION: value}}}
            try:
                await self.api.merge_patch(resource_for("v1", "Pod"), name, ctx.namespace, patch)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            writes += 1
        return writes

    def status(self, ctx: ReconcileContext, status: dict[str, Any]) -> None:
        memory = self._memory.of(ctx.key)
        step, plan = memory.step, memory.plan
        previous = ctx.body.get("status") or {}
        conditions = [
            c for c in status.get("conditions") or [] if c.get("type") not in ("Hibernated", "Fenced")
        ]
        hibernation = step.state.to_status()
        if hibernation is not None:
            status["hibernation"] = hibernation
        if memory.requested:
            fenced_now = sorted(memory.requested & memory.stopped)
            if fenced_now:
                status["fencedInstances"] = fenced_now
            message = fencing_message(memory.requested, memory.stopped, plan.waiting)
            conditions.append(condition(ctx, previous, "Fenced", True, "Fenced", message))
            fenced_not_degraded(status, conditions, memory.requested)
        if ctx.cluster.spec.hibernation or step.hibernating:
            conditions = _hibernation_conditions(ctx, previous, conditions, step)
            status["phase"] = PHASE_WORDS.get(step.state.phase, status.get("phase", ""))
            if step.waiting and step.state.phase is not P.HIBERNATED:
                status["phase"] = f"{status['phase']}: {step.waiting}"[:200]
        status["conditions"] = conditions


def fenced_not_degraded(
    status: dict[str, Any], conditions: list[dict[str, Any]], fenced: frozenset[str]
) -> None:
    """An instance fenced on purpose is not ready, but the cluster is not degraded for it: when the only
    instances not ready are fenced ones (and the primary is ready), Degraded is False `Fenced`."""
    unready = {str(i.get("name")) for i in status.get("instances") or [] if not i.get("ready")}
    degraded = next((c for c in conditions if c.get("type") == "Degraded"), None)
    if degraded is None or degraded.get("reason") != "InstancesNotReady" or not unready <= fenced:
        return
    degraded.update(
        status="False", reason="Fenced", message=f"fenced on purpose: {', '.join(sorted(unready))}"
    )
    status["phase"] = "Fenced"


def _hibernation_conditions(
    ctx: ReconcileContext,
    previous: Mapping[str, Any],
    conditions: list[dict[str, Any]],
    step: HibernationStep,
) -> list[dict[str, Any]]:
    phase = step.state.phase
    primary = step.state.primary or "none recorded"
    hibernated = phase is P.HIBERNATED
    if hibernated:
        words = (
            f"every pod is stopped; volumes, Secrets and Services are kept; primary {primary} leads on wake"
        )
    else:
        words = step.waiting or PHASE_WORDS.get(phase, "the cluster runs")
    out = [c for c in conditions if c.get("type") not in ("Ready", "Progressing", "Degraded")]
    if phase is not P.AWAKE:
        reason = "Hibernated" if hibernated else ("Waking" if phase is P.WAKING_PRIMARY else "Hibernating")
        out[:0] = [
            condition(ctx, previous, "Ready", False, reason, words),
            condition(ctx, previous, "Progressing", not hibernated, reason, words),
            condition(ctx, previous, "Degraded", False, reason, ""),
        ]
        if ctx.problem is not None:  # something the user must hear still wins
            out[2] = condition(ctx, previous, "Degraded", True, *ctx.problem)
    else:
        out[:0] = [c for c in conditions if c.get("type") in ("Ready", "Progressing", "Degraded")]
    out.append(condition(ctx, previous, "Hibernated", hibernated, phase.value, words))
    return out


def condition(ctx: ReconcileContext, previous: Mapping[str, Any], type_: str, value: bool, reason: str,
              message: str) -> dict[str, Any]:  # fmt: skip
    """A condition, its lastTransitionTime kept while its status stays the same."""
    status = "True" if value else "False"
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for old in previous.get("conditions") or ():
        if old.get("type") == type_ and old.get("status") == status and old.get("lastTransitionTime"):
            since = str(old["lastTransitionTime"])
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": ctx.cluster.generation, "lastTransitionTime": since}  # fmt: skip
