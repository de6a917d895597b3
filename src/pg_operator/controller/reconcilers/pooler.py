"""The pooler sub-reconciler: `spec.pooler`'s PgBouncer pods, kept pointed at the primary and paused around
planned switchovers (docs/pooler.md).

- Children: per side a Deployment and a Service, budgets, the pooler's NetworkPolicy (specs/pooler.py);
  the auth role's Secret `<name>-pooler-auth` (CSPRNG, create-only).
- Auth: the role `pgop_pooler` (password from that Secret, sent as a verifier on stdin) and the lookup
  function in every database and template1, set up by one psql over pod exec on the primary when the
  primary, the Secret or the declared databases change — not on a reconcile where nothing did.
- Pointing (level-triggered): each pooler pod carries the host the operator last pointed it at (an
  annotation written after the exec succeeded); a pod whose host is not the current primary's pod name
  is pointed again (`pg-operator-pooler point HOST` in it). A pass where the Deployments and the primary
  are as when every pod was last found pointed lists nothing and execs nothing.
- Switchovers (the high-availability sub-reconciler calls `pause`): every rw pooler pod PAUSEs (its running
  transactions finish, new ones wait), Patroni switches over, each pod is pointed at the new primary and
  RESUMEd in one exec; on any error it is RESUMEd all the same, and each pod's own watchdog resumes a
  pause that outlives its deadline even if the operator dies in between. Session mode is not paused (a
  session holds its server connection; a pause would wait for it to end).

Pooler pods are not in the watch cache (they must not carry the cluster label), so the sub-reconciler lists
their metadata when it has to look at them.

- Stuck pods: while fewer pooler pods are ready than wanted, their whole objects are listed and one that
  cannot run (orchestration/stuck_pods.py: an image that cannot be pulled, a crash loop, no node for it) makes
  the Pooler condition False with that reason and the cause; one Warning Event per cause. Nothing announces a
  change in pods the cache does not hold, so it looks again every STUCK_RECHECK_SECONDS until they are ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lightkube.core.exceptions import ApiError
from prometheus_client import CollectorRegistry, Counter, Histogram

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_PRIMARY
from pg_operator.api.pooler import POOLER_LABEL
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api, HttpStatusError, is_not_found, resource_for
from pg_operator.controller.pod_exec import PSQL, ExecError, PodExec
from pg_operator.controller.reconcilers import ReconcileContext, SubReconciler
from pg_operator.controller.reconcilers.instances import operator_namespace
from pg_operator.controller.writes import Made, WriteMemo
from pg_operator.controller.writes import create as create_owned
from pg_operator.images import pooler_image
from pg_operator.orchestration.failover import leader_configmap_name
from pg_operator.orchestration.hibernation import without_pods
from pg_operator.orchestration.instances import instances_from_pods, patroni_state
from pg_operator.orchestration.stuck_pods import StuckPod, problem, stuck_pods
from pg_operator.specs.network_policy import DEFAULT_MONITORING_NAMESPACE, OperatorPeer
from pg_operator.specs.pooler import (
    CONDITION,
    CONTAINER,
    LIST_DATABASES_SQL,
    PASSWORD_KEY,
    POINTS_TO_ANNOTATION,
    SUPERVISOR,
    PoolerPod,
    auth_secret,
    auth_secret_name,
    children,
    deployment_name,
    desired_target,
    new_password,
    pod_host,
    pooler_pods,
    ready_pods,
    setup_sql,
    setup_trigger,
    status_condition,
    teardown_sql,
    to_point,
)
from pg_operator.specs.secrets import decoded

log = logging.getLogger(__name__)

# The pod's watchdog resumes a pause this long after it began, whatever became of the switchover.
PAUSE_SECONDS = 30
# How long one pod's PAUSE may take (its running transactions finishing) before the switchover goes on
# without that pod paused.
PAUSE_EXEC_SECONDS = 10.0
EXEC_SECONDS = 20.0
RETRY_SECONDS = 5.0
# Even when nothing seems to have moved, the pods are looked at again this often.
RECHECK_SECONDS = 300.0
# After a switchover the sub-reconciler pointed the pods itself: the cache may still show the old primary for
# a moment, so only the new one is pointed at for this long.
HOLD_SECONDS = 10.0
# How long the pooler may wait, still paused, for the new primary to leave recovery.
WRITABLE_SECONDS = 10.0
# While pooler pods are not all ready, they are looked at again this often for a stuck one.
STUCK_RECHECK_SECONDS = 10.0


class PoolerMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.pauses = Counter("pg_operator_pooler_pauses_total",
                              "Pauses of a cluster's pooler around a planned switchover.",
                              ["namespace", "cluster"], registry=registry)  # fmt: skip
        self.pause_seconds = Histogram(
            "pg_operator_pooler_pause_seconds",
            "How long a cluster's pooler stayed paused around a planned switchover (first PAUSE to last "
            "RESUME).",
            ["namespace", "cluster"],
            buckets=(0.25, 0.5, 1, 2, 3, 5, 8, 13, 20, 30, 60),
            registry=registry,
        )
        self.repoints = Counter("pg_operator_pooler_repoints_total",
                                "Pooler pods pointed at a new host outside a planned switchover.",
                                ["namespace", "cluster"], registry=registry)  # fmt: skip


@dataclass
class _State:
    setup: str = ""  # the setup trigger last applied
    pointed: tuple[Any, ...] | None = None  # (Deployments' versions, primary) when all pods were pointed
    pointed_at: float = 0.0
    pointed_count: int = 0
    problem: str | None = None
    hold: tuple[str, float] | None = None  # (primary, until) after a switchover the sub-reconciler drove
    since: dict[str, str] = field(default_factory=dict)
    stuck: list[StuckPod] = field(default_factory=list)  # pooler pods that cannot run, as last listed
    stuck_told: set[tuple[str, str, str, str]] = field(default_factory=set)  # causes a Warning named


@dataclass
class Paused:
    """The rw pooler pods paused for one switchover; `resume` ends it, exactly once."""

    reconciler: PoolerReconciler
    ctx: ReconcileContext
    pods: list[str]
    started: float
    done: bool = False

    async def resume(self, new_primary: str | None) -> None:
        if self.done:
            return
        self.done = True
        await self.reconciler.resume(self.ctx, self, new_primary)


class PoolerReconciler(SubReconciler):
    def __init__(self, api: Api, memo: WriteMemo, events: EventRecorder, pod_exec: PodExec | None,
                 registry: CollectorRegistry | None = None, image: str | None = None,
                 monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE) -> None:  # fmt: skip
        self.api = api
        # Who may scrape the pooler by default besides the operator (specs/network_policy.py).
        self.peers = OperatorPeer(operator_namespace(), monitoring_namespace=monitoring_namespace)
        self.memo = memo
        self.events = events
        self.exec = pod_exec
        self.image = image or pooler_image()  # the install's --pooler-image-repository/-tag
        self.metrics = PoolerMetrics(registry)
        self._state: ClusterMemory[_State] = ClusterMemory(_State)

    def _of(self, ctx: ReconcileContext) -> _State:
        return self._state.of(ctx.key)

    # --- children ---------------------------------------------------------------------------------------

    def children(self, ctx: ReconcileContext) -> list[dict[str, Any]]:  # none run while hibernating
        return without_pods(children(ctx.cluster, self.image, self.peers), ctx.pooler_stopped)

    async def create(self, ctx: ReconcileContext) -> int:
        if ctx.cluster.spec.pooler is None:
            return 0
        name = auth_secret_name(ctx.cluster)
        ctx.wanted.add(("v1", "Secret", name))
        ident = (ctx.namespace, "Secret", name, "create")
        if ctx.snapshot.find("v1", "Secret", name) is not None:
            self.memo.seen(ident)
            return 0
        if self.memo.pending(ident, None, ""):
            return 0
        log.info("creating Secret %s/%s for the pooler's auth role", ctx.namespace, name)
        # Create-only and never over another object: a foreign Secret there is a conflict (its password
        # would otherwise become the auth role's), and its Deployments wait (reconcile holds them back).
        made, _ = await create_owned(self.api, ctx.claims, auth_secret(ctx.cluster, new_password()))
        if made is Made.CREATED:
            self.memo.wrote(ident, None, "")
        return 1

    # --- data plane -------------------------------------------------------------------------------------

    async def act(self, ctx: ReconcileContext) -> None:
        if ctx.cluster.spec.pooler is None:
            self._state.drop(ctx.key)
            await self._tear_down_auth(ctx)
            return
        if ctx.pooler_stopped:  # scaled to 0 with the hibernating cluster (reconcilers/lifecycle.py)
            return
        state = self._of(ctx)
        state.problem = None
        primary = self.primary(ctx)
        await self._set_up_auth(ctx, state, primary)
        await self._point(ctx, state, primary)
        await self._look_for_stuck(ctx, state)

    def primary(self, ctx: ReconcileContext) -> str | None:
        """The instance Patroni runs as primary: labelled so, its member data saying running, its container
        up (not waiting for readiness: after a failover every second counts). When two look so — a killed
        primary's container restarts within seconds with its old label and member data until its Patroni
        relabels it — the holder of Patroni's leader key; None when that does not settle it."""
        pods = [
            pod for pod in ctx.snapshot.of_kind("v1", "Pod") if objects.label(pod, CLUSTER_LABEL) == ctx.name
        ]
        metas = {objects.name(pod): objects.meta(pod) for pod in pods}
        found = [i.name for i in instances_from_pods(pods)
                 if i.role == ROLE_PRIMARY and not i.terminating and not i.container_down
                 and patroni_state(metas[i.name]).get("state") == "running"]  # fmt: skip
        leader_key = ctx.snapshot.find("v1", "ConfigMap", leader_configmap_name(ctx.name))
        leader = objects.annotation(leader_key, "leader") or ""
        if leader in found:
            return leader
        return found[0] if len(found) == 1 else None

    async def _set_up_auth(self, ctx: ReconcileContext, state: _State, primary: str | None) -> None:
        secret = ctx.snapshot.find("v1", "Secret", auth_secret_name(ctx.cluster))
        password = decoded(secret, PASSWORD_KEY)
        if primary is None or self.exec is None or not password or objects.deleting(secret):
            return
        declared = [d.name for d in ctx.cluster.spec.databases or ()]
        declared.append(ctx.cluster.spec.bootstrap.initdb.database)
        trigger = setup_trigger(ctx.cluster, primary, secret, declared)
        if state.setup == trigger:
            return
        try:
            databases = await self._databases(ctx, primary)
            script = setup_sql(password, databases)
            result = await self.exec.run(ctx.namespace, primary, [*PSQL, "-q", "-f", "-"],
                                         stdin=script.encode(), seconds=EXEC_SECONDS)  # fmt: skip
            if result.exit_status != 0:
                lines = [ln for ln in result.stderr.splitlines() if "SCRAM-SHA-256$" not in ln]
                raise ExecError("\n".join(lines).strip()[-300:] or f"psql exited {result.exit_status}")
        except (ExecError, ValueError) as exc:
            state.problem = f"could not set up the pooler's auth role on {primary}: {exc}"
            log.warning("%s/%s: %s", ctx.namespace, ctx.name, state.problem)
            ctx.again_in(RETRY_SECONDS * 3)
            return
        state.setup = trigger
        log.info("%s/%s: pooler auth role and lookup function in %d databases", ctx.namespace, ctx.name,
                 len(databases))  # fmt: skip

    async def _databases(self, ctx: ReconcileContext, primary: str) -> list[str]:
        assert self.exec is not None
        listed = await self.exec.run(ctx.namespace, primary, [*PSQL, "-c", LIST_DATABASES_SQL],
                                     seconds=EXEC_SECONDS)  # fmt: skip
        if listed.exit_status != 0:
            raise ExecError(listed.stderr.strip()[-300:] or f"psql exited {listed.exit_status}")
        return [line.strip() for line in listed.stdout.splitlines() if line.strip()]

    async def _tear_down_auth(self, ctx: ReconcileContext) -> None:
        """Once the pooler is off, its role and lookup leave the database before its Secret goes, so no
        login as the pooler's role outlives the pooler. The Secret marks that there is something to undo:
        it is kept until the SQL ran (a cluster that never had a pooler costs nothing here)."""
        ident = ("v1", "Secret", auth_secret_name(ctx.cluster))
        secret = ctx.snapshot.find(*ident)
        if secret is None or objects.deleting(secret) or self.exec is None:
            return
        ctx.wanted.add(ident)
        primary = self.primary(ctx)
        if primary is None:
            ctx.again_in(RETRY_SECONDS * 3)
            return
        try:
            script = teardown_sql(await self._databases(ctx, primary))
            result = await self.exec.run(ctx.namespace, primary, [*PSQL, "-q", "-f", "-"],
                                         stdin=script.encode(), seconds=EXEC_SECONDS)  # fmt: skip
            if result.exit_status != 0:
                raise ExecError(result.stderr.strip()[-300:] or f"psql exited {result.exit_status}")
        except (ExecError, ValueError) as exc:
            log.warning("%s/%s: could not remove the pooler's auth role on %s: %s", ctx.namespace, ctx.name,
                        primary, exc)  # fmt: skip
            ctx.again_in(RETRY_SECONDS * 3)
            return
        ctx.wanted.discard(ident)
        log.info(
            "%s/%s: the pooler is off: its auth role and lookup function removed", ctx.namespace, ctx.name
        )

    async def _list(self, ctx: ReconcileContext) -> list[PoolerPod]:
        path = f"/api/v1/namespaces/{ctx.namespace}/pods"
        metas: list[dict[str, Any]] = []
        async for page in self.api.list_metadata(path, {"labelSelector": f"{POOLER_LABEL}={ctx.name}"}):
            metas += page
        return pooler_pods(ctx.name, metas)

    def _deployments_mark(self, ctx: ReconcileContext) -> tuple[Any, ...]:
        names = {deployment_name(ctx.cluster, side) for side in ("rw", "ro")}
        return tuple(sorted((objects.name(d), objects.resource_version(d) or "")
                            for d in ctx.snapshot.of_kind("apps/v1", "Deployment")
                            if objects.name(d) in names))  # fmt: skip

    async def _point(self, ctx: ReconcileContext, state: _State, primary: str | None) -> None:
        if self.exec is None:
            return
        now = time.monotonic()
        if state.hold is not None:
            held, until = state.hold
            if primary == held or now >= until:
                state.hold = None  # the cache caught up (or never will): a later failover is news again
            else:
                ctx.again_in(max(0.5, min(RETRY_SECONDS, until - now)))
                return  # the cache has not caught up with the switchover the sub-reconciler just drove
        mark = (self._deployments_mark(ctx), primary)
        if state.pointed == mark and now - state.pointed_at < RECHECK_SECONDS:
            return
        pods = await self._list(ctx)
        todo = to_point(ctx.cluster, pods, primary)
        outcomes = await asyncio.gather(
            *(self._point_one(ctx, pod, host, resume=False) for pod, host in todo)
        )
        ctx.writes += sum(1 for ok in outcomes if ok)
        if todo:
            self.metrics.repoints.labels(namespace=ctx.namespace, cluster=ctx.name).inc(sum(outcomes))
        target = desired_target(ctx.cluster, "rw", primary)
        fixed = {pod for (pod, _), ok in zip(todo, outcomes, strict=True) if ok}
        state.pointed_count = sum(1 for pod in pods if pod.side == "rw" and target is not None
                                  and (pod.points_to == target or pod.name in fixed))  # fmt: skip
        if all(outcomes):
            state.pointed, state.pointed_at = mark, now
        else:
            state.pointed = None
            ctx.again_in(RETRY_SECONDS)

    async def _point_one(self, ctx: ReconcileContext, pod: str, host: str, *, resume: bool) -> bool:
        assert self.exec is not None
        argv = [SUPERVISOR, "point", host, *(["--resume"] if resume else [])]
        try:
            result = await self.exec.run(ctx.namespace, pod, argv, container=CONTAINER, seconds=EXEC_SECONDS)
        except ExecError as exc:
            log.info("%s/%s: pooler pod %s not pointed at %s: %s", ctx.namespace, ctx.name, pod, host, exc)
            return False
        if result.exit_status != 0:
            log.info("%s/%s: pooler pod %s not pointed at %s: %s", ctx.namespace, ctx.name, pod, host,
                     result.output[-300:])  # fmt: skip
            return False
        log.info("%s/%s: pooler pod %s %s", ctx.namespace, ctx.name, pod, result.stdout.strip())
        try:
            patch = {"metadata": {"annotations": {POINTS_TO_ANNOTATION: host}}}
            await self.api.merge_patch(resource_for("v1", "Pod"), pod, ctx.namespace, patch)
        except ApiError as exc:
            if not is_not_found(exc):
                raise
            return False
        return True

    # --- around a planned switchover (called by the high-availability sub-reconciler)
    # -----------------------------

    async def pause(self, ctx: ReconcileContext) -> Paused | None:
        """PAUSE every rw pooler pod before a planned switchover; None when there is nothing to pause.
        The caller must `resume` the result on every path."""
        pooler = ctx.cluster.spec.pooler
        if pooler is None or pooler.mode != "transaction" or self.exec is None:
            return None
        try:
            pods = [pod.name for pod in await self._list(ctx) if pod.side == "rw"]
        except (ApiError, RuntimeError, OSError) as exc:  # list_metadata: RuntimeError for HTTP errors
            log.warning("%s/%s: pooler pods not listed, switching over unpaused: %s", ctx.namespace, ctx.name,
                        exc)  # fmt: skip
            return None
        if not pods:
            return None
        started = time.monotonic()
        outcomes = await asyncio.gather(*(self._pause_one(ctx, pod) for pod in pods))
        paused = [pod for pod, ok in zip(pods, outcomes, strict=True) if ok]
        if not paused:
            return None
        self.metrics.pauses.labels(namespace=ctx.namespace, cluster=ctx.name).inc()
        log.info("%s/%s: pooler paused (%s) in %.3fs", ctx.namespace, ctx.name, ", ".join(paused),
                 time.monotonic() - started)  # fmt: skip
        return Paused(self, ctx, paused, started)

    async def _pause_one(self, ctx: ReconcileContext, pod: str) -> bool:
        assert self.exec is not None
        try:
            result = await self.exec.run(ctx.namespace, pod, [SUPERVISOR, "pause", str(PAUSE_SECONDS)],
                                         container=CONTAINER, seconds=PAUSE_EXEC_SECONDS)  # fmt: skip
        except ExecError as exc:
            log.warning("%s/%s: pooler pod %s not paused: %s", ctx.namespace, ctx.name, pod, exc)
            await self._resume_one(ctx, pod)  # the PAUSE may have gone through before the exec failed
            return False
        if result.exit_status != 0:
            log.warning(
                "%s/%s: pooler pod %s not paused: %s", ctx.namespace, ctx.name, pod, result.output[-300:]
            )
            return False
        return True

    async def _resume_one(self, ctx: ReconcileContext, pod: str) -> bool:
        assert self.exec is not None
        try:
            result = await self.exec.run(ctx.namespace, pod, [SUPERVISOR, "resume"], container=CONTAINER,
                                         seconds=EXEC_SECONDS)  # fmt: skip
        except ExecError as exc:
            log.warning(
                "%s/%s: pooler pod %s not resumed (its watchdog will): %s", ctx.namespace, ctx.name, pod, exc
            )
            return False
        return result.exit_status == 0

    async def resume(self, ctx: ReconcileContext, paused: Paused, new_primary: str | None) -> None:
        """After the switchover: each paused pod pointed at the new primary and resumed in one exec; when
        there is no new primary (the switchover failed) or pointing fails, resumed as it was."""
        host = pod_host(ctx.cluster, new_primary) if new_primary else None
        if new_primary is not None and not await self._writable(ctx, new_primary):
            log.warning("%s/%s: %s does not take writes yet; resuming the pooler pointed at it anyway",
                        ctx.namespace, ctx.name, new_primary)  # fmt: skip

        async def one(pod: str) -> None:
            try:
                if host is not None and await self._point_one(ctx, pod, host, resume=True):
                    return
            except Exception:  # whatever broke, the pod must not stay paused
                log.exception(
                    "%s/%s: pooler pod %s not pointed after the switchover", ctx.namespace, ctx.name, pod
                )
            await self._resume_one(ctx, pod)

        await asyncio.gather(*(one(pod) for pod in paused.pods), return_exceptions=True)
        took = time.monotonic() - paused.started
        self.metrics.pause_seconds.labels(namespace=ctx.namespace, cluster=ctx.name).observe(took)
        log.info("%s/%s: pooler resumed after %.3fs%s", ctx.namespace, ctx.name, took,
                 f", pointing at {host}" if host else "")  # fmt: skip
        state = self._of(ctx)
        state.pointed = None  # look again on the next reconcile
        if new_primary:
            state.hold = (new_primary, time.monotonic() + HOLD_SECONDS)

    async def _writable(self, ctx: ReconcileContext, pod: str) -> bool:
        """Whether the new primary has left recovery: Patroni answers the switchover once the candidate
        holds the leader key, which can be a moment before its promotion lets it write. A transaction the
        pooler resumed into a server still in recovery would fail."""
        assert self.exec is not None
        deadline = time.monotonic() + WRITABLE_SECONDS
        while time.monotonic() < deadline:
            try:
                result = await self.exec.run(ctx.namespace, pod, [*PSQL, "-c", "SELECT pg_is_in_recovery()"],
                                             seconds=5)  # fmt: skip
                if result.exit_status == 0 and result.stdout.strip() == "f":
                    return True
            except ExecError:
                pass
            await asyncio.sleep(0.1)
        return False

    async def _look_for_stuck(self, ctx: ReconcileContext, state: _State) -> None:
        """While pooler pods are not all ready: which of them cannot run, and a Warning per new cause."""
        pooler = ctx.cluster.spec.pooler
        assert pooler is not None
        ready = ready_pods(ctx.cluster, ctx.snapshot.of_kind("apps/v1", "Deployment"))
        if ready >= pooler.instances * len(pooler.sides):
            state.stuck, state.stuck_told = [], set()
            return
        ctx.again_in(STUCK_RECHECK_SECONDS)
        path = f"/api/v1/namespaces/{ctx.namespace}/pods"
        try:
            page = await self.api.list_page(path, {"labelSelector": f"{POOLER_LABEL}={ctx.name}"})
        except (HttpStatusError, OSError) as exc:
            # A failed look must not fail the reconcile; the recheck retries.
            log.info("%s/%s: pooler pods not listed: %s", ctx.namespace, ctx.name, exc)
            return
        prefixes = tuple(f"{deployment_name(ctx.cluster, side)}-" for side in ("rw", "ro"))
        pods = [p for p in page.get("items") or () if objects.name(p).startswith(prefixes)]
        state.stuck = stuck_pods(pods, (), datetime.now(UTC))
        state.stuck_told &= {s.identity for s in state.stuck}  # gone and back is news again
        for s in state.stuck:
            if s.identity not in state.stuck_told:
                state.stuck_told.add(s.identity)
                ctx.writes += int(await self.events.record(ctx.body, "Warning", s.reason.value, s.message))

    # --- status -----------------------------------------------------------------------------------------

    def status(self, ctx: ReconcileContext, status: dict[str, Any]) -> None:
        if ctx.cluster.spec.pooler is None or ctx.pooler_stopped:  # the Hibernated condition says it
            return
        state = self._of(ctx)
        ready = ready_pods(ctx.cluster, ctx.snapshot.of_kind("apps/v1", "Deployment"))
        ok, reason, message = status_condition(ctx.cluster, ready, state.pointed_count, self.primary(ctx),
                                               state.problem)  # fmt: skip
        stuck = problem(state.stuck)
        if stuck is not None and not ok and not state.problem:  # says why the pods are not ready
            reason, message = stuck
        value = "True" if ok else "False"
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for old in (ctx.body.get("status") or {}).get("conditions") or ():
            if old.get("type") == CONDITION and old.get("status") == value and old.get("lastTransitionTime"):
                since = str(old["lastTransitionTime"])
        status["conditions"] = [*status.get("conditions", []), {
            "type": CONDITION, "status": value, "reason": reason, "message": message,
            "observedGeneration": ctx.cluster.generation, "lastTransitionTime": since}]  # fmt: skip
