"""Rollout order for image changes and scale-down: the on-call engineer's rules as pure functions.

One action per reconcile; the controller acts and the next reconcile re-plans from what it observes,
so a crash of the operator mid-rollout loses nothing.

Rules:
- never more than one instance down: act only when every instance is ready;
- replicas first, highest ordinal first; each must be back, streaming and caught up before the next;
- then a switchover to the healthiest upgraded replica, then the old primary (now a replica);
- an upgraded instance that does not become ready in time stops the rollout and says why;
- scale-down removes the highest ordinals, and never the primary: switch over first;
- a setting that needs a restart: replicas first, one at a time, each back and caught up before the next,
  then the primary in place (a planned restart keeps its leader key, so nothing fails over).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pg_operator.api.constants import ROLE_PRIMARY, ROLE_REPLICA
from pg_operator.orchestration.instances import Instance

ActionKind = Literal["none", "wait", "delete_pod", "switchover", "restart", "halt"]

# A replica more than this far behind is not "caught up" for rollout purposes.
MAX_CATCH_UP_LAG_BYTES = 16 * 1024 * 1024
STALL_AFTER = timedelta(minutes=5)
# A restart for a setting takes seconds; an instance not ready for this long while settings wait for
# a restart has not come back. Patroni's own word (FAILED_STATES) halts at once.
RESTART_STALL_AFTER = timedelta(seconds=60)
# Patroni says "restart failed (running)": the state before the restart in brackets.
FAILED_STATES = ("start failed", "restart failed", "crashed")


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    target: str = ""  # the pod to delete, or the switchover candidate
    reason: str = ""


NONE = Action("none")


def best_candidate(
    instances: Sequence[Instance], *, below_ordinal: int | None = None, image: str | None = None
) -> Instance | None:
    """The healthiest replica: streaming, least lag, then lowest ordinal. When Patroni names synchronous
    standbys, only they qualify: Patroni refuses a switchover to any other."""
    pool = [
        i
        for i in instances
        if i.healthy_replica
        and (below_ordinal is None or i.ordinal < below_ordinal)
        and (image is None or i.image == image)
    ]
    if any(i.member is not None and i.member.is_sync for i in instances):
        pool = [i for i in pool if i.member is not None and i.member.is_sync]
    return min(pool, key=lambda i: (i.lag, i.ordinal), default=None)


def _blocking(instances: Sequence[Instance], expected: int) -> Action | None:
    """Why nothing may be taken down now, if anything stands in the way."""
    if len(instances) < expected:
        present = {i.name for i in instances}
        return Action("wait", reason=f"waiting for {expected - len(present)} missing instance(s)")
    for i in instances:
        if i.terminating:
            return Action("wait", reason=f"waiting for {i.name} to terminate")
        if not i.ready:
            return Action("wait", reason=f"waiting for {i.name} to become ready")
        if not i.role:
            return Action("wait", reason=f"waiting for Patroni to report the role of {i.name}")
    return None


def _last_replica(pool: Sequence[Instance]) -> Instance | None:
    """Replicas go first, the highest ordinal first (the one a scale-down would remove first)."""
    return max((i for i in pool if i.role == ROLE_REPLICA), key=lambda i: i.ordinal, default=None)


def _behind(instances: Sequence[Instance], max_lag_bytes: int) -> Action | None:
    """A replica among these that has not caught up (unknown lag counts as behind)."""
    for i in instances:
        if i.role == ROLE_REPLICA and i.lag > max_lag_bytes:
            return Action("wait", reason=f"waiting for {i.name} to catch up")
    return None


def plan_update(
    instances: Sequence[Instance],
    desired_image: str,
    expected: int,
    now: datetime,
    *,
    stall_after: timedelta = STALL_AFTER,
    max_lag_bytes: int = MAX_CATCH_UP_LAG_BYTES,
) -> Action:
    outdated = [i for i in instances if i.image != desired_image and not i.terminating]
    updated = [i for i in instances if i.image == desired_image]
    if not outdated:
        return NONE
    # A pod that cannot start (its image cannot be pulled, it crash-loops, no node takes it) runs no
    # PostgreSQL and serves nothing: it is replaced at once, so fixing spec.image unsticks the cluster.
    for i in outdated:
        if i.cannot_start and not i.ready:
            return Action(
                "delete_pod",
                target=i.name,
                reason=f"replacing {i.name}, which cannot start, with {desired_image}",
            )
    for i in updated:
        age = now - i.created if i.created else timedelta(0)
        if not i.ready and age > stall_after:
            return Action(
                "halt",
                target=i.name,
                reason=(
                    f"{i.name} runs {desired_image} but is not ready after {int(age.total_seconds())} s; "
                    "the rollout stopped: fix the image or set spec.image back"
                ),
            )
    blocked = _blocking(instances, expected) or _behind(updated, max_lag_bytes)
    if blocked:
        return blocked
    target = _last_replica(outdated)
    if target is not None:
        return Action(
            "delete_pod", target=target.name, reason=f"recreating replica {target.name} with {desired_image}"
        )
    primary = next(i for i in outdated if i.role == ROLE_PRIMARY)
    if len(instances) == 1:
        return Action(
            "delete_pod",
            target=primary.name,
            reason=f"single instance: restarting {primary.name} with {desired_image} in place",
        )
    candidate = best_candidate(instances, image=desired_image)
    if candidate is None:
        return Action("wait", reason="waiting for an upgraded replica to stream before the switchover")
    return Action(
        "switchover",
        target=candidate.name,
        reason=f"switching over from {primary.name} to upgraded {candidate.name}",
    )


def plan_scale(instances: Sequence[Instance], desired_replicas: int) -> tuple[int, Action]:
    """The StatefulSet replica count to set now, and what must happen first.

    Scaling down while the primary sits on an ordinal that would go away first moves the primary
    to a surviving replica; until then the StatefulSet keeps its current size."""
    current = max((i.ordinal + 1 for i in instances), default=0)
    if desired_replicas >= current:
        return desired_replicas, NONE
    primary = next((i for i in instances if i.role == ROLE_PRIMARY and not i.terminating), None)
    if primary is None or primary.ordinal < desired_replicas:
        return desired_replicas, NONE
    candidate = best_candidate(instances, below_ordinal=desired_replicas)
    if candidate is None:
        return current, Action(
            "wait",
            reason=(
                f"scale-down to {desired_replicas} waits: primary {primary.name} would be removed and no "
                "surviving replica is streaming"
            ),
        )
    return current, Action(
        "switchover",
        target=candidate.name,
        reason=f"moving the primary off {primary.name} before scaling down",
    )


def _setting_names(instance: Instance) -> str:
    return ", ".join(instance.pending_restart or ()) or "settings"


def _member_state(instance: Instance) -> str:
    return instance.member.state if instance.member is not None else instance.state


def restart_halt(
    instances: Sequence[Instance], now: datetime | None, *, stall_after: timedelta = RESTART_STALL_AFTER
) -> Action | None:
    """An instance that does not come back while settings wait for a restart stops the rollout, naming
    the instance, Patroni's state of it and the settings (as the instances still waiting list them).
    The primary keeps its previous value; setting the spec back lets Patroni start the instance with
    the old value (no manual step)."""
    waiting = sorted({name for i in instances if i.pending_restart for name in i.pending_restart})
    if not any(i.pending_restart is not None for i in instances):
        return None
    for i in instances:
        if i.ready or i.terminating:
            continue
        state = _member_state(i)
        stalled = now is not None and i.not_ready_since is not None and now - i.not_ready_since > stall_after
        if not state.startswith(FAILED_STATES) and not stalled:
            continue
        settings = ", ".join(waiting) or "a setting"
        primary = next((p.name for p in instances if p.role == ROLE_PRIMARY and p.ready), "")
        serving = (
            f"primary {primary} keeps serving with the previous value" if primary else "no primary is ready"
        )
        said = f"Patroni: {state}" if state else "not ready"
        return Action(
            "halt",
            target=i.name,
            reason=(
                f"{i.name} does not start ({said}) while {settings} "
                f"{'wait' if len(waiting) > 1 else 'waits'} for a restart: the restart "
                f"rollout stopped at {i.name} and {serving}; set spec.postgresql.parameters {settings} "
                "back (or to a value the instances can start with) and it recovers on its own"
            ),
        )
    return None


def plan_restart(
    instances: Sequence[Instance],
    expected: int,
    *,
    max_lag_bytes: int = MAX_CATCH_UP_LAG_BYTES,
    now: datetime | None = None,
) -> Action:
    """Restart the instances Patroni marks pending_restart after a settings change, one at a time.

    The primary goes last and is restarted in place: Patroni keeps the leader key through a planned
    restart, so the outage is one PostgreSQL restart (a switchover would cost one too, plus a second
    restart of the old primary). Nothing happens while any instance is missing, not ready or behind;
    one that does not come back halts the rollout (restart_halt)."""
    pending = [i for i in instances if i.pending_restart is not None and not i.terminating]
    if not pending:
        return NONE
    halt = restart_halt(instances, now)
    if halt is not None:
        return halt
    blocked = _blocking(instances, expected) or _behind(instances, max_lag_bytes)
    if blocked:
        return blocked
    target = _last_replica(pending)
    if target is not None:
        return Action(
            "restart",
            target=target.name,
            reason=f"restarting replica {target.name} to apply {_setting_names(target)}",
        )
    primary = pending[0]
    return Action(
        "restart",
        target=primary.name,
        reason=f"restarting primary {primary.name} in place to apply {_setting_names(primary)}",
    )
