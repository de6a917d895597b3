"""What the major upgrade's steps do to the world (docs/major-upgrades.md): exec in the instances' containers,
Patroni's pause, the staging container, the stream that seeds the replicas, and saving the upgrade's state
in the cluster's annotation. Also what the sub-reconciler remembers of each cluster (one object per
cluster, dropped whole when the cluster goes).

The decisions are pure and live in `orchestration/major_upgrade*.py`; the steps that sequence these calls
are in `major_upgrade_steps.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.types import PatchType

from pg_operator.api.constants import ROLE_PRIMARY
from pg_operator.backup import generations
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, PostgresClusterResource
from pg_operator.controller.pod_exec import ExecError, PodExec
from pg_operator.controller.reconcilers import ReconcileContext
from pg_operator.controller.reconcilers.high_availability import HighAvailabilityReconciler, patroni_auth
from pg_operator.orchestration import major_upgrade as mu
from pg_operator.orchestration import major_upgrade_replicas as mur
from pg_operator.orchestration import major_upgrade_state as mus
from pg_operator.orchestration.instances import Instance, instances_from_pods, patroni_state
from pg_operator.patroni.client import PatroniError, patch_config

log = logging.getLogger(__name__)

PAUSE_POLL_SECONDS = 0.5
# How long streaming the new cluster's unlinked files (catalogs, pg_xact, WAL) to the replicas may take.
SEED_SECONDS = 600


@dataclass
class UpgradeMemory:
    """What the sub-reconciler remembers of one cluster between reconciles."""

    # The state the upgrade was last saved with: a reconcile may come before the watch cache shows the
    # annotation written by the previous one, and must not redo a step.
    state: mus.UpgradeState | None = None
    # The generation of its source's backups a restored cluster reads (decided once).
    recovery: generations.Generation | None = None


@dataclass(frozen=True)
class Seeded:
    """The replicas that keep their data (seeded from the primary), those to re-clone with why, and what
    the stream cost."""

    linked: list[str]
    recloned: dict[str, str]
    seconds: float | None = None
    bytes: int | None = None


class UpgradePlane(RemembersClusters):
    def __init__(
        self,
        api: Api,
        events: EventRecorder,
        pod_exec: PodExec | None,
        high_availability: HighAvailabilityReconciler,
    ) -> None:
        self.api = api
        self.events = events
        self.pod_exec = pod_exec
        self.ha = high_availability
        self.memory: ClusterMemory[UpgradeMemory] = ClusterMemory(UpgradeMemory)

    def remembered(self, ctx: ReconcileContext) -> UpgradeMemory:
        return self.memory.of((ctx.namespace, ctx.name))

    def state(self, ctx: ReconcileContext) -> mus.UpgradeState | None:
        """The state the reconcile acts on (ValueError: the annotation's is unreadable)."""
        memory = self.remembered(ctx)
        state = mus.current(mus.UpgradeState.from_annotation(ctx.body), memory.state)
        if state is None:
            memory.state = None
        return state

    async def save(
        self,
        ctx: ReconcileContext,
        state: mus.UpgradeState,
        event: tuple[str, str, str] | None = None,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Record `state` in the cluster's annotation (with `annotations`), then the Event (type, reason,
        message). A failed write raises: the reconcile fails and is retried, the step not taken as done."""
        patch = {"metadata": {"annotations": {**(annotations or {}), mus.ANNOTATION: state.to_annotation()}}}
        try:
            await self.api.merge_patch(PostgresClusterResource, ctx.name, ctx.namespace, patch)
        except ApiError as exc:
            log.warning("%s/%s: could not record the upgrade's state: %s", ctx.namespace, ctx.name, exc)
            raise
        ctx.writes += 1
        self.remembered(ctx).state = state
        if event is not None:
            await self.record(ctx, *event)

    def note(self, ctx: ReconcileContext, state: mus.UpgradeState) -> None:
        """Remember a step's progress without recording it: a reconcile that stops half-way (an error, a wait)
        takes up from there, as long as this operator runs (after a restart, from the last saved state)."""
        self.remembered(ctx).state = state

    async def record(self, ctx: ReconcileContext, event_type: str, reason: str, message: str) -> None:
        ctx.writes += int(await self.events.record(ctx.body, event_type, reason, message))

    # --- reading the pods ----------------------------------------------------------------------------

    @staticmethod
    def instances(ctx: ReconcileContext) -> list[Instance]:
        return instances_from_pods(ctx.snapshot.of_kind("v1", "Pod"))

    def primary(self, ctx: ReconcileContext) -> Instance | None:
        for inst in self.instances(ctx):
            if inst.role == ROLE_PRIMARY and inst.ready and not inst.terminating:
                return inst
        return None

    def named(self, ctx: ReconcileContext, name: str | None) -> Instance | None:
        return next((i for i in self.instances(ctx) if i.name == name), None)

    # --- acting in the pods ----------------------------------------------------------------------------

    async def exec(
        self, ctx: ReconcileContext, pod: str, script: str, seconds: float
    ) -> tuple[int, str] | None:
        """Run `script` in the pod's postgres container: (exit status, output), or None when it could not."""
        assert self.pod_exec is not None  # the steps run only with pod exec
        try:
            res = await self.pod_exec.run(ctx.namespace, pod, ["/bin/sh", "-c", script], seconds=seconds)
        except (ExecError, TimeoutError) as exc:
            log.info("%s/%s: exec in %s failed: %s", ctx.namespace, ctx.name, pod, exc)
            return None
        return res.exit_status, res.output

    async def stage(self, ctx: ReconcileContext, primary: Instance, stage: mus.Staging) -> mus.StagingResult:
        """Copy the new major's tree onto the primary's volume with an ephemeral container of the new
        image; the container is added on the first call, later calls read how it went."""
        pod = ctx.snapshot.find("v1", "Pod", primary.name) or {}
        result = mus.staging_result(pod, stage)
        if not result.absent:
            return result
        spec: Mapping[str, Any] = pod.get("spec") or {}
        containers = [*(spec.get("ephemeralContainers") or ()), mus.staging_container(stage)]
        await self.api.client.patch(
            Pod.Ephemeralcontainers,
            primary.name,
            {"spec": {"ephemeralContainers": containers}},
            namespace=ctx.namespace,
            patch_type=PatchType.STRATEGIC,
        )
        return mus.StagingResult()

    async def pause(self, ctx: ReconcileContext, primary: Instance, pause: bool) -> bool:
        """Set Patroni's pause through the primary's REST API; False when it could not be asked."""
        member = self.ha.endpoint(ctx, primary)
        if member is None:
            return False
        try:
            await patch_config(
                self.ha.session(), member, {"pause": pause}, patroni_auth(ctx.snapshot, ctx.cluster)
            )
        except PatroniError as exc:
            log.info("%s/%s: pause=%s refused: %s", ctx.namespace, ctx.name, pause, exc)
            return False
        return True

    async def paused_everywhere(self, ctx: ReconcileContext, instances: list[Instance], until: float) -> bool:
        """Poll the members' data (fresh from the API, not the reconcile's snapshot) until every member took
        the pause; True then, or once `until` has passed (a member whose Patroni does not run publishes
        nothing, but cannot start PostgreSQL either). False: ask again on the next reconcile."""
        while True:
            members: list[Mapping[str, Any]] = []
            for inst in instances:
                try:
                    pod = await self.api.get(Pod, inst.name, ctx.namespace)
                except ApiError as exc:
                    log.info("%s/%s: reading %s failed: %s", ctx.namespace, ctx.name, inst.name, exc)
                    return False
                members.append(patroni_state({"annotations": pod.metadata.annotations or {}}))
            if mu.members_paused(members) or time.time() >= until:
                return True
            await asyncio.sleep(PAUSE_POLL_SECONDS)

    async def set_initialize(self, ctx: ReconcileContext, sysid: str) -> None:
        """Patroni's record of the cluster's system identifier (and the old timelines' history) in its
        `<cluster>-config` ConfigMap: the new cluster has a new identifier and starts on timeline 1."""
        patch = {"metadata": {"annotations": {"initialize": sysid, "history": None}}}
        await self.api.merge_patch(ConfigMap, f"{ctx.name}-config", ctx.namespace, patch)

    async def seed_replicas(
        self, ctx: ReconcileContext, primary: Instance, layout: mu.Layout, state: mus.UpgradeState,
        plan: mur.ReplicaPlan,
    ) -> Seeded:  # fmt: skip
        """Give each replica the plan allows the new cluster: the primary's unlinked files streamed into it,
        its own old files hard-linked. The others (and those whose seed failed) are re-cloned."""
        if not plan.seed:
            return Seeded([], dict(plan.reclone))
        assert self.pod_exec is not None
        old, new = state.old_major, state.new_major
        source = (primary.name, ["/bin/sh", "-c", mur.source_script(layout, old, new)])
        sink = ["/bin/sh", "-c", mur.sink_script(layout, old, new, state.checkpoint or "")]
        started = time.monotonic()
        try:
            piped = await self.pod_exec.pipe(ctx.namespace, source, [(name, sink) for name in plan.seed],
                                             seconds=SEED_SECONDS)  # fmt: skip
        except ExecError as exc:
            log.info("%s/%s: streaming the new cluster from %s failed: %s",
                     ctx.namespace, ctx.name, primary.name, exc)  # fmt: skip
            unstreamed = dict.fromkeys(plan.seed, "the primary's new cluster could not be streamed")
            return Seeded([], {**plan.reclone, **unstreamed})
        linked, recloned = [], dict(plan.reclone)
        for name in plan.seed:
            failure = mur.seed_failure(piped.source.exit_status, piped.source.stderr, piped.sinks.get(name))
            if failure is None:
                linked.append(name)
            else:
                recloned[name] = failure
        seconds = round(time.monotonic() - started, 3)
        log.info("%s/%s: seeded %s from %s (%d bytes in %.1f s); re-cloning %s", ctx.namespace, ctx.name,
                 linked, primary.name, piped.bytes, seconds, sorted(recloned))  # fmt: skip
        return Seeded(linked, recloned, seconds, piped.bytes)
