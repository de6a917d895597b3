"""Fast failover where the primary's death is certain.

Patroni alone waits out the leader key's ttl after an unclean death, because a missed heartbeat could
be a slow primary. The kubelet knows better: when it reports the primary's database container as not
running, nothing can still write through it, so the operator may release the dead holder's leader key
and let the healthiest replica take over on Patroni's next loop instead of after the ttl.

Patroni's Kubernetes DCS (ConfigMaps mode) keeps the key as the `leader` annotation of the
`<scope>-leader` ConfigMap; replicas judge its validity by when they last saw it change, so removing
the annotation (with the observed resourceVersion as precondition, so a holder that renewed in the
meantime wins) is what makes them race for it at once.

The operator also wakes Patroni loops that would otherwise sleep out `loop_wait` (plan_nudges).
Patroni's loop wakes early for a change of the leader key, not for another member's data, which lives
in pod annotations: a member that must pg_rewind first waits for a new leader to publish the checkpoint
after its promotion, and learns of it only on its next loop; and a leader adds a replica that started
streaming to its quorum voters only on its next loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import ROLE_PRIMARY
from pg_operator.orchestration.instances import Instance

LEADER_ANNOTATION = "leader"


def leader_configmap_name(scope: str) -> str:
    return f"{scope}-leader"


def leader_holder(configmap: Mapping[str, Any] | None) -> str | None:
    return objects.annotation(configmap, LEADER_ANNOTATION) or None


@dataclass(frozen=True)
class LockRelease:
    holder: str
    resource_version: str
    reason: str

    def patch(self) -> dict[str, Any]:
        """A merge patch that removes the key only if nobody touched the ConfigMap since we looked."""
        return {
            "metadata": {"resourceVersion": self.resource_version, "annotations": {LEADER_ANNOTATION: None}}
        }


def sync_configmap_name(scope: str) -> str:
    return f"{scope}-sync"


def sync_standbys(sync_configmap: Mapping[str, Any] | None, leader: str) -> frozenset[str] | None:
    """The synchronous standbys Patroni recorded for `leader` in its `<scope>-sync` key (in quorum mode the
    quorum's voters, each a candidate): None when the key does not name this leader (asynchronous
    replication), an empty set when synchronous mode is active for it but no standby is recorded yet
    (right after bootstrap: then Patroni promotes nobody)."""
    annotations = objects.annotations(sync_configmap)
    if annotations.get("leader") != leader:
        return None
    return frozenset(n.strip() for n in str(annotations.get("sync_standby") or "").split(",") if n.strip())


def plan_lock_release(
    configmap: Mapping[str, Any] | None,
    instances: Sequence[Instance],
    sync_configmap: Mapping[str, Any] | None = None,
) -> LockRelease | None:
    """Release the leader key only when (1) its holder's database container is reported not running by
    the kubelet, and (2) a running replica that Patroni would promote can take over: with synchronous
    replication, only a recorded synchronous standby (Patroni promotes no other, so releasing for
    anyone else would only end the holder's own recovery early). Anything less certain is left to
    Patroni."""
    holder = leader_holder(configmap)
    if holder is None:
        return None
    owner = next((i for i in instances if i.name == holder), None)
    if owner is None or not owner.container_down or owner.terminating:
        # Gone from the API (maybe force-deleted while still running) or shutting down gracefully
        # (Patroni releases the key itself): not certain, so not ours to decide.
        return None
    allowed = sync_standbys(sync_configmap, holder)
    if not any(
        i.viable_replica and i.name != holder and (allowed is None or i.name in allowed) for i in instances
    ):
        return None
    version = objects.resource_version(configmap)
    if not version:
        return None
    return LockRelease(
        holder=holder,
        resource_version=version,
        reason=f"the kubelet reports {holder}'s database container as not running",
    )


# How long after a promotion a member off the leader's timeline is woken for its pg_rewind: a promotion
# settles within a few loops; past this window a member that still lags is Patroni's business alone.
NUDGE_WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Nudge:
    member: str
    reason: str


def _acquired(configmap: Mapping[str, Any] | None) -> datetime | None:
    value = objects.annotation(configmap, "acquireTime")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def _promoted(configmap: Mapping[str, Any] | None) -> bool:
    """The key changed hands at least once: its holder was promoted, not bootstrapped."""
    value = objects.annotation(configmap, "transitions")
    return bool(value) and value.isdigit() and int(value) > 0


def plan_nudges(
    configmap: Mapping[str, Any] | None,
    instances: Sequence[Instance],
    sync_configmap: Mapping[str, Any] | None,
    now: datetime,
) -> list[Nudge]:
    """The members whose Patroni loop to wake now, while the leader key's holder runs as primary:
    - the leader itself, with synchronous replication on, while a replica publishes that it streams on
      the leader's timeline but the `<scope>-sync` key does not count it as a voter: quorum commit adds
      a voter one loop after it streams, and a crash of the primary before then leaves the new leader
      waiting on the previous voters, the dead primary among them, for a loop (Patroni then holds quorum
      changes back for loop_wait after a promotion, so this can only be shortened before the crash);
    - within NUDGE_WINDOW_SECONDS of a promotion (the key changed hands), every other running member not
      yet on the leader's timeline, once the leader has published the checkpoint after its promotion
      (then a pg_rewind from it can start at once)."""
    holder = leader_holder(configmap)
    leader = next((i for i in instances if i.name == holder), None)
    if (
        holder is None
        or leader is None
        or leader.role != ROLE_PRIMARY
        or leader.container_down
        or leader.terminating
        or not leader.pod_ip
        or leader.timeline is None
    ):
        return []
    nudges = []
    if objects.annotation(sync_configmap, "leader"):
        voters = sync_standbys(sync_configmap, holder) or frozenset()
        outside = sorted(
            i.name
            for i in instances
            if i.name != holder
            and i.streaming
            and not i.container_down
            and not i.terminating
            and i.timeline == leader.timeline
            and i.name not in voters
        )
        if outside:
            nudges.append(
                Nudge(holder, f"{', '.join(outside)} streams from it but is not a synchronous standby yet")
            )
    acquired = _acquired(configmap)
    # A few seconds of clock skew between the instance and the operator are allowed for.
    recent = (
        acquired is not None
        and _promoted(configmap)
        and -5 <= (now - acquired).total_seconds() <= NUDGE_WINDOW_SECONDS
    )
    if recent and not leader.checkpoint_pending:
        for inst in instances:
            if (
                inst.name != holder
                and inst.pod_ip
                and not inst.container_down
                and not inst.terminating
                and (inst.timeline is None or inst.timeline < leader.timeline)
            ):
                nudges.append(
                    Nudge(
                        inst.name,
                        f"it is not on {holder}'s timeline {leader.timeline} yet, "
                        "and a pg_rewind from it can start",
                    )
                )
    return nudges
