"""The high-availability sub-reconciler's upkeep of Patroni's own objects and loops, done on every reconcile
whatever else it plans (reconcilers/high_availability.py):

- fast failover: when the kubelet reports the primary's database container dead, release its leader key
  so a replica takes over now rather than after Patroni's ttl (orchestration.failover.plan_lock_release);
- wake the Patroni loops that would otherwise sleep out loop_wait (orchestration.failover.plan_nudges);
- give Patroni's ConfigMaps an owner so deleting the cluster removes them too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp
from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.constants import API_VERSION, KIND
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, is_conflict, is_not_found, resource_for
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.writes import uid_refused
from pg_operator.orchestration.failover import (
    Nudge,
    leader_configmap_name,
    plan_lock_release,
    plan_nudges,
    sync_configmap_name,
)
from pg_operator.orchestration.instances import Instance
from pg_operator.patroni.client import Endpoint, PatroniAuth, PatroniError, patch_config
from pg_operator.specs.ownership import patroni_may_have_created

log = logging.getLogger(__name__)

PATRONI_CONFIGMAP_SUFFIXES = ("-leader", "-config", "-sync", "-failover")
# A member's Patroni loop is woken at most this often, and this many times in a row
# (orchestration.failover.plan_nudges).
NUDGE_INTERVAL_SECONDS = 1.0
NUDGES_PER_EPISODE = 10
# The removal of a key nobody sets: Patroni finds nothing changed, writes nothing, and wakes its loop. Any
# real key would risk writing back a value the operator's cache holds while a change is under way.
WAKE_PATCH = {"pg_operator_wake": None}

# Per member of one cluster: when its loop was last woken, and how often in this episode.
Episodes = dict[str, tuple[float, int]]


async def release_dead_leader(api: Api, events: EventRecorder, ctx: ReconcileContext,
                              instances: list[Instance]) -> int:  # fmt: skip
    """Fast failover: the writes made (the leader key released, its Warning Event)."""
    cluster, snapshot = ctx.cluster, ctx.snapshot
    leader = snapshot.find("v1", "ConfigMap", leader_configmap_name(cluster.name))
    sync = snapshot.find("v1", "ConfigMap", sync_configmap_name(cluster.name))
    release = plan_lock_release(leader, instances, sync)
    if release is None:
        return 0
    try:
        await api.merge_patch(
            resource_for("v1", "ConfigMap"),
            leader_configmap_name(cluster.name),
            cluster.namespace,
            release.patch(),
        )
    except ApiError as exc:
        if is_conflict(exc) or is_not_found(exc):
            return 0  # the holder renewed (so it lives) or the key is gone: nothing to do
        raise
    log.warning("%s/%s: released the leader key of %s: %s", cluster.namespace, cluster.name, release.holder,
                release.reason)  # fmt: skip
    recorded = await events.record(
        ctx.body,
        "Warning",
        "FailoverStarted",
        f"{release.reason}: released its leader key so a replica takes over without waiting for the ttl",
    )
    return 1 + int(recorded)


class LoopWaker(RemembersClusters):
    """Wakes the Patroni loops that would sleep out loop_wait with a PATCH /config that changes nothing:
    Patroni wakes the loop of the member that receives it and, the configuration being unchanged, writes
    nothing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.episodes: ClusterMemory[Episodes] = ClusterMemory(dict)

    async def wake(
        self,
        ctx: ReconcileContext,
        instances: list[Instance],
        session: aiohttp.ClientSession,
        endpoint: Callable[[Instance], Endpoint | None],
        auth: PatroniAuth | None,
    ) -> None:
        cluster, snapshot = ctx.cluster, ctx.snapshot
        nudges = plan_nudges(
            snapshot.find("v1", "ConfigMap", leader_configmap_name(cluster.name)),
            instances,
            snapshot.find("v1", "ConfigMap", sync_configmap_name(cluster.name)),
            datetime.now(UTC),
        )
        key = (ctx.namespace, ctx.name)
        if not nudges:
            self.episodes.drop(key)
            return
        due = self._due(key, nudges)
        if due is None:
            return
        ctx.again_in(NUDGE_INTERVAL_SECONDS)
        by_name = {i.name: i for i in instances}

        async def nudge(n: Nudge) -> None:
            member = endpoint(by_name[n.member])
            if member is None:
                return
            try:
                await patch_config(session, member, WAKE_PATCH, auth)
            except PatroniError as exc:
                log.info(
                    "%s/%s: could not wake %s's Patroni loop: %s", ctx.namespace, ctx.name, n.member, exc
                )
            else:
                log.info("%s/%s: woke %s's Patroni loop: %s", ctx.namespace, ctx.name, n.member, n.reason)

        await asyncio.gather(*(nudge(n) for n in due))

    def _due(self, key: tuple[str, str], nudges: list[Nudge]) -> list[Nudge] | None:
        """The nudges to send now, counted in their episodes (None: every episode is spent). One episode
        per member: it ends when the member is no longer planned; within one, a member is woken at most
        NUDGES_PER_EPISODE times (a condition Patroni does not act on stays Patroni's)."""
        before = self.episodes.get(key) or {}
        episodes = {n.member: before.get(n.member, (-1.0, 0)) for n in nudges}
        self.episodes.set(key, episodes)
        now = self.clock()
        due = [
            n
            for n in nudges
            if episodes[n.member][1] < NUDGES_PER_EPISODE
            and (episodes[n.member][1] == 0 or now - episodes[n.member][0] >= NUDGE_INTERVAL_SECONDS)
        ]
        if not due and all(count >= NUDGES_PER_EPISODE for _, count in episodes.values()):
            return None
        for n in due:
            episodes[n.member] = (now, episodes[n.member][1] + 1)
        return due


async def adopt_patroni_configmaps(api: Api, ctx: ReconcileContext) -> int:
    """Patroni creates its ConfigMaps without an owner; give them one (not as controller: they stay
    Patroni's) so the garbage collector removes them with the cluster. Only those Patroni of this cluster
    can have created (specs.ownership.patroni_may_have_created: none older than the cluster, none with an
    owner), and only as observed: the patch is pinned to the version read, so an object that replaced it
    meanwhile is refused (409) rather than adopted."""
    cluster, writes = ctx.cluster, 0
    wanted = {cluster.name + suffix for suffix in PATRONI_CONFIGMAP_SUFFIXES}
    for cm in ctx.snapshot.of_kind("v1", "ConfigMap"):
        if objects.name(cm) not in wanted or not patroni_may_have_created(cm, ctx.body):
            continue
        ref = {"apiVersion": API_VERSION, "kind": KIND, "name": cluster.name, "uid": cluster.uid}
        patch = {"metadata": {"ownerReferences": [ref], "resourceVersion": objects.resource_version(cm),
                              "uid": objects.uid(cm)}}  # fmt: skip
        try:
            await api.merge_patch(resource_for("v1", "ConfigMap"), objects.name(cm), cluster.namespace, patch)
        except ApiError as exc:
            if not (is_not_found(exc) or is_conflict(exc) or uid_refused(exc)):
                raise
        writes += 1
    return writes
