"""The major-upgrade sub-reconciler: a raised `spec.version` upgrades the cluster in place
(docs/major-upgrades.md), with the image `spec.image` names when it is set.

The data runs the major in the StatefulSet's `PGOP_PG_MAJOR`; until the upgrade has moved the data, every
other sub-reconciler builds the cluster at that major and the image that runs it (the reconcile's cluster is
replaced, `orchestration/major_upgrade_views.py`), so no pod is ever started with a newer major's binaries
on older data. The upgrade moves one phase per pass, through the one transition table of
`orchestration/major_upgrade_state.py`, its state kept in the cluster's `db.example.com/major-upgrade`
annotation. Each phase's step is in `major_upgrade_steps.py`, the calls it makes in
`major_upgrade_plane.py`, backups across the upgrade in `major_upgrade_backups.py`.
"""

from __future__ import annotations

import logging
import time

from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.reconcilers.high_availability import HighAvailabilityReconciler
from pg_operator.controller.reconcilers.major_upgrade_backups import (
    follow_generation,
    recovery_generation,
    store_generations,
)
from pg_operator.controller.reconcilers.major_upgrade_plane import UpgradePlane
from pg_operator.controller.reconcilers.major_upgrade_steps import STEPS
from pg_operator.orchestration import major_upgrade_state as mus
from pg_operator.orchestration.major_upgrade_views import at_major, running_image, running_major

log = logging.getLogger(__name__)


class MajorUpgradeReconciler(SubReconciler):
    def __init__(
        self,
        api: Api,
        events: EventRecorder,
        pod_exec: PodExec | None,
        high_availability: HighAvailabilityReconciler,
    ) -> None:
        self.pod_exec = pod_exec
        self.plane = UpgradePlane(api, events, pod_exec, high_availability)

    async def act(self, ctx: ReconcileContext) -> None:
        if ctx.hibernating:
            # Stopped or starting on purpose (reconcilers/lifecycle.py): nothing is upgraded, and the cluster
            # is built at the major its data is on; an upgrade asked for meanwhile begins after the wake.
            self._hold_hibernating(ctx)
            return
        if ctx.cluster.spec.bootstrap.recovery is not None:
            await recovery_generation(self.plane, ctx)
        try:
            state = self.plane.state(ctx)
        except ValueError as exc:
            self._unreadable(ctx, str(exc))
            return
        await self._act(ctx, state)
        follow_generation(ctx, self.plane.state(ctx))

    def _hold_hibernating(self, ctx: ReconcileContext) -> None:
        try:
            state = self.plane.state(ctx)
        except ValueError:
            state = None
        if state is not None:
            self._hold(ctx, state)
            return
        running = running_major(ctx.statefulset)
        if running is not None:
            ctx.cluster = at_major(ctx.cluster, running, running_image(ctx.statefulset))

    def _unreadable(self, ctx: ReconcileContext, why: str) -> None:
        """An annotation this operator cannot read: nothing is done, the cluster is held where it runs."""
        ctx.report(("MajorUpgradeStateUnreadable", f"annotation {mus.ANNOTATION}: {why}"))
        running = running_major(ctx.statefulset)
        if running is not None:
            ctx.cluster = at_major(ctx.cluster, running, running_image(ctx.statefulset))
        follow_generation(ctx, None)

    async def _act(self, ctx: ReconcileContext, state: mus.UpgradeState | None) -> None:
        running = running_major(ctx.statefulset)
        wanted, spec_image = ctx.cluster.spec.version, ctx.cluster.spec.image
        if state is not None and state.phase in mus.DATA_ON_NEW_MAJOR:
            state = await store_generations(self.plane, ctx, state)
        try:
            plan = mus.plan_pass(state, running, wanted, spec_image, time.time())
        except ValueError as exc:
            ctx.report(("MajorDowngradeRefused", str(exc)))
            if running is not None:
                ctx.cluster = at_major(ctx.cluster, running, running_image(ctx.statefulset))
            return
        if plan is None:
            return
        state = plan.state
        if plan.begun:
            await self.plane.save(ctx, state, ("Normal", "MajorUpgradeChecking",
                                               f"checking the upgrade from PostgreSQL {running} to {wanted} "
                                               "on the live data"))  # fmt: skip
        self._hold(ctx, state)
        if self.pod_exec is None:
            ctx.report(("MajorUpgradeUnavailable", "the operator runs without pod exec"))
            return
        step = STEPS.get(state.phase)
        if step is not None:
            await step(self.plane, ctx, state)
        ctx.report(self._image_problem(state, spec_image))

    def _hold(self, ctx: ReconcileContext, state: mus.UpgradeState) -> None:
        """Every other sub-reconciler builds the cluster where the data is: at the old major and the image
        that runs it until the upgrade swapped the data, then at the new major and the upgrade's image."""
        if state.phase in mus.DATA_ON_NEW_MAJOR:
            ctx.cluster = at_major(ctx.cluster, state.new_major, state.image)
        else:
            ctx.cluster = at_major(ctx.cluster, state.old_major, running_image(ctx.statefulset))

    @staticmethod
    def _image_problem(state: mus.UpgradeState, spec_image: str | None) -> tuple[str, str] | None:
        why = mus.image_not_honoured(state, spec_image)
        return None if why is None else ("MajorUpgradeImageNotUsed", why)

    async def follow_up(self, ctx: ReconcileContext) -> int:
        """While Starting: the pods of the old image deleted (the primary's first), so the StatefulSet
        recreates them at the new major."""
        if ctx.hibernating:
            return 0
        try:
            state = self.plane.state(ctx)
        except ValueError:
            return 0
        if state is None or state.phase is not mus.Phase.STARTING:
            return 0
        instances = self.plane.instances(ctx)
        writes = 0
        for name in mus.pods_to_recreate(instances, state.primary or "", mus.upgrade_image(state)):
            await self.plane.api.delete("v1", "Pod", name, ctx.namespace)
            writes += 1
        return writes
