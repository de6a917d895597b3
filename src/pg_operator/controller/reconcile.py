"""The cluster reconciler: one level-triggered reconcile of one PostgresCluster, in named phases:
observe (the watch cache) → refuse an invalid spec → each sub-reconciler's data-plane steps → apply the
sub-reconcilers' desired children → delete what no sub-reconciler wants → each sub-reconciler's
follow-up writes → report (status, Events, metrics) → requeue when a step waits on something no watch
event announces.

The cluster writes only what it owns (specs/ownership.py): observing sets foreign objects at the
cluster's names aside (no sub-reconciler reads them as the cluster's), every write goes through
`controller/writes.py` with the context's claims, a child that would put a foreign object to use is
postponed, and the conflicts are reported as Degraded `Conflict` with a Warning Event per object.

The capabilities themselves are sub-reconcilers (`controller/reconcilers/`); this module is the glue
that runs them. A reconcile where nothing differs makes no API request at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.image_policy import (
    DEFAULT_ALLOWED_REPOSITORIES,
    AllowedRepositories,
    image_refusal,
    refusal_is_news,
)
from pg_operator.controller.cache import ENDPOINT_SLICE_KIND, Cache, Snapshot
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.failure_report import FailureReporter
from pg_operator.controller.instance_metrics import InstanceMetrics
from pg_operator.controller.keys import ClusterKey, is_owned_by
from pg_operator.controller.kube_api import Api, PostgresClusterResource, is_conflict, is_not_found
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.reconcilers import ObjectId, Problem, ReconcileContext, SubReconciler
from pg_operator.controller.reconcilers.bootstrap_import import ImportReconciler
from pg_operator.controller.reconcilers.credentials import CredentialsReconciler
from pg_operator.controller.reconcilers.drains import DrainsReconciler
from pg_operator.controller.reconcilers.high_availability import HighAvailabilityReconciler
from pg_operator.controller.reconcilers.instances import InstancesReconciler
from pg_operator.controller.reconcilers.lifecycle import LifecycleReconciler
from pg_operator.controller.reconcilers.major_upgrade import MajorUpgradeReconciler
from pg_operator.controller.reconcilers.node_loss import NodeLossReconciler
from pg_operator.controller.reconcilers.pooler import PoolerReconciler
from pg_operator.controller.reconcilers.roles import RolesReconciler
from pg_operator.controller.reconcilers.storage import StorageReconciler
from pg_operator.controller.reconcilers.tls import TlsReconciler
from pg_operator.controller.writes import (
    Applier,
    Claims,
    WriteMemo,
    all_of,
    canonical,
    ident_of,
    status_patch,
)
from pg_operator.controller.writes import delete as delete_owned
from pg_operator.specs import MANAGED_KINDS, compute_status
from pg_operator.specs.ca_rotation import TRUST_PERIOD
from pg_operator.specs.network_policy import DEFAULT_MONITORING_NAMESPACE
from pg_operator.specs.ownership import (
    conflict_event,
    conflict_message,
    generated_names,
    needs,
    set_aside,
)
from pg_operator.specs.status import CONFLICT_REASON, replication_lag

log = logging.getLogger(__name__)

# Kinds written after every other child of the same reconcile (see Reconciler._apply_children).
SECOND_WAVE = frozenset({"RoleBinding", "StatefulSet", "Deployment"})


@dataclass
class Outcome:
    writes: int = 0
    problem: Problem | None = None
    phase: str | None = None
    gone: bool = False
    requeue_after: float | None = None  # the loop's Outcome protocol (loop.py); resyncs suffice here


# How long a foreign object a write met (and the cache does not show) is taken as known by later reconciles.
FOREIGN_KNOWN_SECONDS = 120.0

# After a status write lost the race to another writer (the backup reconcilers): the watch event of the
# newer cluster wakes it anyway; this is the fallback.
STATUS_CONFLICT_RETRY_SECONDS = 1.0


def namespace_terminating_refusal(status: Mapping[str, Any]) -> bool:
    """Whether an API error's Status is the refusal to create anything in a namespace being deleted
    (403, a cause of type NamespaceTerminating, "... because it is being terminated"). Retrying cannot
    help: the namespace, and the cluster with it, is going."""
    if status.get("code") != 403:
        return False
    causes = (status.get("details") or {}).get("causes") or ()
    if any((cause or {}).get("reason") == "NamespaceTerminating" for cause in causes):
        return True
    return "because it is being terminated" in str(status.get("message") or "")


def namespace_terminating(exc: ApiError) -> bool:
    """namespace_terminating_refusal for a client error (the one test both the reconciler and the
    work loop use)."""
    return namespace_terminating_refusal(exc.status.to_dict() if exc.status else {})


def cluster_mark(body: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(uid, resourceVersion): identifies one version of one cluster object."""
    if not objects.uid(body):
        return None
    return (objects.uid(body), objects.resource_version(body) or "")


def undesired_children(
    snapshot: Snapshot,
    cluster_uid: str,
    managed: Iterable[tuple[str, str]],
    wanted: set[ObjectId],
) -> list[dict[str, Any]]:
    """Children of the managed kinds that this cluster controls but no longer wants."""
    out = []
    for api_version, kind in managed:
        for obj in snapshot.of_kind(api_version, kind):
            if objects.deleting(obj) or not is_owned_by(obj, cluster_uid):
                continue
            if (api_version, kind, objects.name(obj)) not in wanted:
                out.append(obj)
    return out


class Reconciler(RemembersClusters):
    def __init__(
        self,
        api: Api,
        cache: Cache,
        metrics: Metrics,
        events: EventRecorder,
        pod_exec: PodExec | None = None,
        ca_trust_period: timedelta = TRUST_PERIOD,
        allowed_images: AllowedRepositories = DEFAULT_ALLOWED_REPOSITORIES,
        monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE,
    ) -> None:
        self.api = api
        self.allowed_images = allowed_images
        self.cache = cache
        self.metrics = metrics
        self.instance_metrics = InstanceMetrics(metrics.registry)
        self.events = events
        self.memo = WriteMemo()
        self.applier = Applier(api, self.memo)
        self.high_availability = HighAvailabilityReconciler(api, events, pod_exec)
        pooler = PoolerReconciler(
            api,
            self.memo,
            events,
            pod_exec,
            registry=metrics.registry,
            monitoring_namespace=monitoring_namespace,
        )
        self.high_availability.switchover_guard = pooler  # paused around the switchovers it drives
        # In phase order: the storage check comes first so the StatefulSet waits for its class.
        self.sub_reconcilers: tuple[SubReconciler, ...] = (
            # Before all: what is stopped on purpose (fenced, hibernating), which the others stand aside for.
            LifecycleReconciler(api, events, self.high_availability),
            # First: until the data is on the new major it holds every other sub-reconciler at the running
            # one.
            MajorUpgradeReconciler(api, events, pod_exec, self.high_availability),
            StorageReconciler(api, self.memo),
            # Before the others' problems: an instance on a lost node is what a person must hear first.
            NodeLossReconciler(api, events),
            self.high_availability,
            DrainsReconciler(),
            InstancesReconciler(events, monitoring_namespace=monitoring_namespace),
            CredentialsReconciler(api, self.memo, events, pod_exec),
            TlsReconciler(api, self.memo, events, registry=metrics.registry, ca_trust_period=ca_trust_period),
            RolesReconciler(api, self.memo, events, pod_exec),
            # After the credentials: the import restores as the application role.
            ImportReconciler(api, self.memo, events),
            pooler,  # after roles: the databases they create get the pooler's lookup function
        )
        self._invalid_seen: ClusterMemory[int] = ClusterMemory()
        # Clusters whose namespace refused a write because it is being deleted, by the cluster version
        # (cluster_mark) that was refused: the wake-ups the deletion itself causes (children going one by
        # one) make no more requests until the cluster object changes or goes.
        self._terminating: ClusterMemory[tuple[str, str]] = ClusterMemory()
        self.failures = FailureReporter(api, events, cache.cluster)
        # The foreign objects each cluster's Warning Events have named (one Event per object and episode).
        self._conflicts_told: ClusterMemory[set[ObjectId]] = ClusterMemory(set)
        # Foreign objects writes met that the cache does not hold (no cluster label), with when they were
        # met: a reconcile within FOREIGN_KNOWN_SECONDS takes them as known instead of asking again (their
        # removal sends no watch event; a later reconcile asks anew).
        self._met: ClusterMemory[dict[ObjectId, tuple[dict[str, Any], float]]] = ClusterMemory()

    async def reconcile(self, key: ClusterKey) -> Outcome:
        started = time.perf_counter()
        try:
            outcome = await self._reconcile(key)
            self.failures.succeeded(key)
            return outcome
        except ApiError as exc:
            if namespace_terminating(exc):
                mark = cluster_mark(self.cache.cluster(key))
                if mark is not None:
                    self._terminating.set(key, mark)
            raise
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def report_failure(self, key: ClusterKey, exc: Exception, failures_in_a_row: int) -> int:
        """The work loop's hook after a failed pass (controller/failure_report.py says when it reports)."""
        return await self.failures.failed(key, exc, failures_in_a_row)

    async def _reconcile(self, key: ClusterKey) -> Outcome:
        snapshot = self.cache.snapshot(key)
        if self._gone(key, snapshot.cluster):
            return Outcome(gone=True)
        body = snapshot.cluster
        assert body is not None  # _gone says so
        cluster = await self._parsed_or_refused(key, body)
        if isinstance(cluster, Outcome):
            return cluster
        # Observe: at the cluster's names only its own objects are read as its (the others set aside).
        children, foreign = set_aside(snapshot.children, cluster.uid, generated_names(cluster))
        snapshot = Snapshot(snapshot.cluster, children, snapshot.storage_classes,
                            snapshot.storage_classes_known, nodes=snapshot.nodes)  # fmt: skip
        now = time.monotonic()
        met = {
            i: seen
            for i, seen in (self._met.drop(key) or {}).items()
            if now - seen[1] < FOREIGN_KNOWN_SECONDS
        }
        known: dict[ObjectId, Mapping[str, Any]] = {i: b for i, (b, _) in met.items()}
        claims = Claims(cluster.namespace, cluster.uid, {**known, **foreign})
        ctx = ReconcileContext(body, cluster, snapshot, snapshot.find("apps/v1", "StatefulSet", cluster.name),
                        claims=claims)  # fmt: skip
        refusal = image_refusal(cluster.spec.image, self.allowed_images)
        if refusal is not None:  # refuse invalid: no room runs, nothing is written but the report
            return await self._refused(ctx, refusal)
        for reconciler in self.sub_reconcilers:
            await reconciler.act(ctx)
        await self._apply_children(ctx)
        await self._delete_undesired(ctx)
        ctx.writes += await self._report_conflicts(key, ctx)
        met.update({i: (dict(b), now) for i, b in ctx.claims.met.items()})
        if met:
            self._met.set(key, {i: v for i, v in met.items() if i in ctx.claims.conflicts})
        for reconciler in self.sub_reconcilers:
            ctx.writes += await reconciler.follow_up(ctx)
        outcome = Outcome(problem=ctx.problem, requeue_after=ctx.requeue_after)
        ctx.writes += await self._report(ctx, outcome)
        outcome.writes = ctx.writes
        return outcome

    def _gone(self, key: ClusterKey, body: Mapping[str, Any] | None) -> bool:
        """Observe: the cluster is gone or going (the garbage collector removes the children through
        their ownerReferences), or its namespace refused us and nothing changed since."""
        if body is None or objects.deleting(body):
            self.metrics.set_phase(key, None)
            self.instance_metrics.set(key, {}, {})
            self.failures.succeeded(key)
            # What this reconciler and every sub-reconciler remember of the cluster (cluster_memory.py).
            for holder in (self, *self.sub_reconcilers):
                holder.forget(key)
            return True
        refused_mark = self._terminating.get(key)
        if refused_mark is None:
            return False
        if refused_mark == cluster_mark(body):
            return True  # its namespace is being deleted; nothing was changed since
        self._terminating.drop(key)
        return False

    async def _parsed_or_refused(self, key: ClusterKey, body: dict[str, Any]) -> PostgresCluster | Outcome:
        """Refuse an invalid spec (one the API server's schema let through) with one Warning per
        generation, and touch nothing."""
        try:
            cluster = PostgresCluster.from_obj(body)
        except ValueError as exc:
            generation = objects.generation(body)
            outcome = Outcome(problem=("InvalidSpec", str(exc)), phase="Invalid")
            if self._invalid_seen.get(key) != generation:
                self._invalid_seen.set(key, generation)
                await self.events.record(body, "Warning", "InvalidSpec", str(exc))
                outcome.writes += 1
            return outcome
        self._invalid_seen.drop(key)
        return cluster

    async def _refused(self, ctx: ReconcileContext, refusal: Problem) -> Outcome:
        """A spec only the runtime can refuse (spec.image outside the install's allow-list): the status
        says so (Degraded with the refusal) and a Warning Event once per refusal; no child is written, so
        the pods keep what they run."""
        ctx.report(refusal)
        outcome = Outcome(problem=refusal)
        if refusal_is_news(ctx.body.get("status"), refusal):
            outcome.writes += int(await self.events.record(ctx.body, "Warning", *refusal))
        outcome.writes += await self._report(ctx, outcome)
        return outcome

    async def _apply_children(self, ctx: ReconcileContext) -> None:
        """Two waves of writes sent together: what depends on nothing, then what depends on the first
        wave — the RoleBinding (the API server checks a binding against its Role, which must exist)
        and the workloads (their pods need the account, the configuration and the Secrets). A new
        cluster's ~15 writes then cost a few round trips instead of fifteen: at 1000 new clusters the
        first passes were bound by the API server's latency, not by the operator's CPU. The first wave
        also finds the foreign objects the cache could not show (a POST refused): the second holds back
        what would put one to use."""
        desired = [
            (reconciler, child) for reconciler in self.sub_reconcilers for child in reconciler.children(ctx)
        ]
        ctx.wanted.update((c["apiVersion"], c["kind"], c["metadata"]["name"]) for _, c in desired)
        siblings = [c for _, c in desired]
        first = [(r, c) for r, c in desired if c["kind"] not in SECOND_WAVE]
        second = [(r, c) for r, c in desired if c["kind"] in SECOND_WAVE]
        ctx.writes += await all_of(
            [self._apply_child(ctx, reconciler, child, siblings) for reconciler, child in first]
            + [reconciler.create(ctx) for reconciler in self.sub_reconcilers]
        )
        ctx.writes += await all_of(
            [self._apply_child(ctx, reconciler, child, siblings) for reconciler, child in second]
        )

    async def _apply_child(
        self,
        ctx: ReconcileContext,
        reconciler: SubReconciler,
        desired: dict[str, Any],
        siblings: list[dict[str, Any]],
    ) -> int:
        observed = ctx.snapshot.find(desired["apiVersion"], desired["kind"], desired["metadata"]["name"])
        if reconciler.postpone(ctx, desired, observed):
            return 0
        blockers = ctx.claims.foreign_among(needs(desired, siblings))
        if blockers:
            ctx.claims.held[ident_of(desired)] = blockers
            return 0
        if not await self.applier.apply_if_needed(ctx.claims, desired, observed):
            return 0
        return 1 + await reconciler.applied(ctx, desired, observed)

    async def _delete_undesired(self, ctx: ReconcileContext) -> None:
        for obj in undesired_children(ctx.snapshot, ctx.cluster.uid, MANAGED_KINDS, ctx.wanted):
            kind, name, rv = str(obj.get("kind")), objects.name(obj), objects.resource_version(obj)
            gone = (ctx.namespace, kind, name, "delete")
            if self.memo.pending(gone, rv, ""):
                continue
            log.info("deleting %s %s/%s: no longer desired", kind, ctx.namespace, name)
            await delete_owned(self.api, ctx.claims, obj)  # pinned to its uid: never one that replaced it
            self.memo.wrote(gone, rv, "")
            ctx.writes += 1

    async def _report_conflicts(self, key: ClusterKey, ctx: ReconcileContext) -> int:
        """Foreign objects the reconcile would have written: Degraded `Conflict` (it wins over the
        sub-reconcilers'
        problems: it says what is held back and why) and one Warning Event per object."""
        conflicts = ctx.claims.conflicts
        told = self._conflicts_told.of(key)
        told &= set(conflicts)  # a conflict gone and back later is news again
        if not conflicts:
            self._conflicts_told.drop(key)
            return 0
        ctx.problem = (CONFLICT_REASON, conflict_message(conflicts, ctx.claims.held))
        writes = 0
        for ident in sorted(set(conflicts) - told):
            told.add(ident)
            writes += int(await self.events.record(ctx.body, "Warning", CONFLICT_REASON,
                                                   conflict_event(ident, conflicts[ident])))  # fmt: skip
        return writes

    async def _report(self, ctx: ReconcileContext, outcome: Outcome) -> int:
        """Report: the status (written only when it changed), metrics, and Events for what changed."""
        cluster, body = ctx.cluster, ctx.body
        key = (cluster.namespace, cluster.name)
        pods = ctx.snapshot.of_kind("v1", "Pod")
        previous = body.get("status") or None
        status = compute_status(
            cluster,
            previous=previous,
            statefulset=ctx.statefulset,
            pods=pods,
            now=datetime.now(UTC),
            problem=ctx.problem,
            endpoint_slices=ctx.snapshot.of_kind(*ENDPOINT_SLICE_KIND),
        )
        for reconciler in self.sub_reconcilers:
            reconciler.status(ctx, status)
        outcome.phase = str(status.get("phase") or "")
        self.metrics.set_phase(key, outcome.phase)
        self.instance_metrics.set(
            key,
            replication_lag(cluster.name, pods),
            {str(i["name"]): int(i["timeline"]) for i in status.get("instances") or [] if "timeline" in i},
        )
        if canonical(status) == canonical(previous or {}):
            return 0
        ident = (cluster.namespace, "PostgresCluster", cluster.name, "status")
        rv = objects.resource_version(body)
        if self.memo.pending(ident, rv, canonical(status)):
            return 0
        # Conditional on the version read: the backup reconcilers write their conditions into the same
        # list, and a status computed from an older copy would put theirs back as they were.
        patch = {"metadata": {"resourceVersion": rv}, **status_patch(previous, status)}
        try:
            await self.api.merge_patch(
                PostgresClusterResource, cluster.name, cluster.namespace, patch, subresource_status=True
            )
        except ApiError as exc:
            if is_not_found(exc):
                return 1
            if is_conflict(exc):
                log.debug("status of %s/%s: the cluster changed meanwhile", cluster.namespace, cluster.name)
                outcome.requeue_after = STATUS_CONFLICT_RETRY_SECONDS
                return 0
            raise
        self.memo.wrote(ident, rv, canonical(status))
        return 1 + await self._status_events(body, previous, status)

    async def _status_events(
        self, body: dict[str, Any], previous: Mapping[str, Any] | None, status: Mapping[str, Any]
    ) -> int:
        writes = 0
        was_primary = str((previous or {}).get("currentPrimary") or "")
        primary = str(status.get("currentPrimary") or "")
        if was_primary and primary and primary != was_primary:
            writes += await self.events.record(
                body, "Warning", "PrimaryChanged", f"the primary moved from {was_primary} to {primary}"
            )
        was = objects.condition_status(previous, "Degraded") == "True"
        now_degraded = objects.condition(status, "Degraded") or {}
        if now_degraded.get("status") == "True" and not was:
            reason = str(now_degraded.get("reason") or "Degraded")
            if not self.events.warned_recently(
                body, reason
            ):  # a sub-reconciler said it this reconcile, in its words
                writes += await self.events.record(
                    body, "Warning", reason, str(now_degraded.get("message") or reason)
                )
        elif was and now_degraded.get("status") != "True":
            writes += await self.events.record(
                body, "Normal", "Recovered", "the cluster is no longer degraded"
            )
        return writes
