"""The import sub-reconciler: `spec.bootstrap.import` (docs/import.md).

Once the new cluster's primary runs, it creates the import Job (specs/import_job.py, create-only: a Job's
template is immutable), follows it through `status.import` (orchestration/bootstrap_import.py), and holds
the cluster's Ready condition False until the import succeeded. A failure is the cluster's Degraded
reason `ImportFailed` with the failed step's last words, and one Warning Event; deleting the failed Job
runs another. Once `status.import` records success the Job is no longer wanted, so the reconcile deletes
it, and it is never created again.

The source's password Secret is used only when it carries the cluster's label (the rule the backup
credentials follow, backup/store_policy.py): otherwise a tenant could have the Job send any Secret of the
namespace to a server of its choosing. The operator itself never reads the password: the Job's pod gets
it by secretKeyRef.

While the Job runs, its pod is read by one GET-list (by the Job's name) per pass, with a pass every
few seconds: the pod carries no cluster label (it is not an instance), so the cache does not hold it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pg_operator.api.bootstrap_import import PASSWORD_FIELD
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.cache import ENDPOINT_SLICE_KIND
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder, OncePerMessage
from pg_operator.controller.kube_api import Api
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.writes import Made, WriteMemo
from pg_operator.controller.writes import create as create_owned
from pg_operator.orchestration.bootstrap_import import (
    IMPORT_FAILED,
    ImportPhase,
    ImportState,
    from_status,
    next_attempt,
    observe,
    password_refusal,
    ready_reason,
    wants_job,
)
from pg_operator.specs import names
from pg_operator.specs.import_job import import_job, job_name
from pg_operator.specs.status import routes_to

log = logging.getLogger(__name__)

JOB = ("batch/v1", "Job")
POLL_SECONDS = 5.0  # how often a running import's pod is looked at


class ImportReconciler(SubReconciler):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder) -> None:
        self.api = api
        self.memo = memo
        self.warned = OncePerMessage(events)
        # What this pass observed, for its status hook (the status is written after every act).
        self._observed: ClusterMemory[ImportState] = ClusterMemory()

    def _previous(self, ctx: ReconcileContext) -> Mapping[str, Any] | None:
        value = (ctx.body.get("status") or {}).get("import")
        return value if isinstance(value, Mapping) else None

    def _state(self, ctx: ReconcileContext) -> ImportState:
        spec = ctx.cluster.spec.bootstrap.import_
        assert spec is not None
        return from_status(self._previous(ctx), list(spec.databases))

    def _refusal(self, ctx: ReconcileContext) -> tuple[str, str] | None:
        spec = ctx.cluster.spec.bootstrap.import_
        assert spec is not None
        name = spec.source.password_secret.name
        return password_refusal(ctx.snapshot.find("v1", "Secret", name), cluster=ctx.name, secret_name=name,
                                label=CLUSTER_LABEL, field=PASSWORD_FIELD)  # fmt: skip

    async def _pod(self, ctx: ReconcileContext, job: Mapping[str, Any]) -> Mapping[str, Any] | None:
        path = f"/api/v1/namespaces/{ctx.namespace}/pods"
        selector = f"batch.kubernetes.io/job-name={job_name(ctx.cluster)}"
        page = await self.api.list_page(path, {"labelSelector": selector})
        pods = [p for p in page.get("items") or () if isinstance(p, dict)]
        # The newest pod (backoffLimit 0: there is one, unless it was deleted and the Job made another).
        pods.sort(key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
        return pods[-1] if pods else None

    def _primary_routed(self, ctx: ReconcileContext) -> bool:
        """The primary runs and `-rw` routes to it: the restore connects through that Service."""
        primary = ctx.running_primary()
        slices = ctx.snapshot.of_kind(*ENDPOINT_SLICE_KIND)
        return primary is not None and routes_to(slices, names.rw_service(ctx.cluster), primary)

    async def act(self, ctx: ReconcileContext) -> None:
        if ctx.cluster.spec.bootstrap.import_ is None:
            return
        state = self._state(ctx)
        if state.phase == ImportPhase.SUCCEEDED:
            return
        name = job_name(ctx.cluster)
        job = ctx.snapshot.find(*JOB, name)
        # The Job stays wanted until the status records success (then the reconcile deletes it).
        ctx.wanted.add((*JOB, name))
        pod = None
        if job is not None and state.phase != ImportPhase.FAILED:
            pod = await self._pod(ctx, job)
        state = observe(state, job, pod, name)
        if wants_job(state, job is not None, self._primary_routed(ctx)):
            refusal = self._refusal(ctx)
            if refusal is not None:
                ctx.report(refusal)
                await self.warned.warn(ctx.body, *refusal)
            else:
                ident = (ctx.namespace, "Job", name, "create")
                if not self.memo.pending(ident, None, ""):
                    log.info("creating the import Job %s/%s", ctx.namespace, name)
                    made, _ = await create_owned(self.api, ctx.claims, import_job(ctx.cluster))
                    ctx.writes += 1
                    if made is Made.CREATED:
                        self.memo.wrote(ident, None, "")
                        state = next_attempt(state)
        elif job is not None:
            self.memo.seen((ctx.namespace, "Job", name, "create"))
        if state.phase == ImportPhase.FAILED:
            problem = (IMPORT_FAILED, state.message or "the import failed")
            ctx.report(problem)
            ctx.writes += await self.warned.warn(ctx.body, *problem)
        elif not state.finished:
            ctx.again_in(POLL_SECONDS)
        self._observed.set(ctx.key, state)

    def status(self, ctx: ReconcileContext, status: dict[str, Any]) -> None:
        if ctx.cluster.spec.bootstrap.import_ is None:
            return
        state = self._observed.get(ctx.key) or self._state(ctx)
        status["import"] = state.as_status()
        reason = ready_reason(state)
        if reason is None:
            return
        if status.get("phase") in ("Healthy", "Creating"):
            status["phase"] = "Importing" if state.phase != ImportPhase.FAILED else "ImportFailed"
        # Since when Ready is False: kept from the previous status, so an unchanged import writes nothing.
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for old in (ctx.body.get("status") or {}).get("conditions") or ():
            if old.get("type") == "Ready" and old.get("status") == "False" and old.get("lastTransitionTime"):
                since = str(old["lastTransitionTime"])
        for cond in status.get("conditions") or ():
            if cond.get("type") == "Ready":
                cond.update(status="False", reason=reason[0], message=reason[1], lastTransitionTime=since)
