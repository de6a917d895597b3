"""One level-triggered reconcile of one PostgresCluster: observe (the watch cache) → diff → act → report.

A pass where nothing differs makes no API request at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator.api.cluster import PostgresCluster
from pg_operator.controller.cache import Cache, Snapshot
from pg_operator.controller.dataplane import DataPlane, StepResult
from pg_operator.controller.diff import HASH_ANNOTATION, object_differences, with_hash
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.instance_metrics import InstanceMetrics
from pg_operator.controller.keys import ClusterKey, is_owned_by
from pg_operator.controller.kube_api import (
    Api,
    PostgresClusterResource,
    is_conflict,
    is_not_found,
    resource_for,
)
from pg_operator.controller.metrics import Metrics
from pg_operator.specs import (
    MANAGED_KINDS,
    ClusterPasswords,
    build_secrets,
    compute_status,
    desired_children,
    pvc_resizes,
    secret_names,
)
from pg_operator.specs.status import replication_lag

log = logging.getLogger(__name__)

Problem = tuple[str, str]
# Kinds written after every other child of the same pass (see Reconciler._reconcile).
SECOND_WAVE = frozenset({"RoleBinding", "StatefulSet"})
ObjectId = tuple[str, str, str]  # (apiVersion, kind, name)


@dataclass
class Outcome:
    writes: int = 0
    problem: Problem | None = None
    phase: str | None = None
    gone: bool = False


async def all_of(writes: Iterable[Awaitable[int]]) -> int:
    """Run the writes together and wait for every one; then raise the first failure (so a refusal keeps
    its type for the callers' checks, and no write is left running behind a pass that ended) or return
    how many were made."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return sum(r for r in results if isinstance(r, int))


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _condition(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for cond in (status or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def status_patch(previous: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch turning `previous` status into exactly `desired` (removed keys set to null)."""
    patch: dict[str, Any] = dict(desired)
    for k in previous or {}:
        if k not in desired:
            patch[k] = None
    return {"status": patch}


def storage_class_problem(spec: Mapping[str, Any], snapshot: Snapshot) -> Problem | None:
    name = spec.get("storageClassName")
    if name and snapshot.storage_classes_known and name not in snapshot.storage_classes:
        return (
            "StorageClassNotFound",
            f"spec.storageClassName names StorageClass {name!r}, which does not exist; "
            "the StatefulSet is created once it does",
        )
    return None


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
    meta = _meta(body)
    if not meta.get("uid"):
        return None
    return (str(meta["uid"]), str(meta.get("resourceVersion") or ""))


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
            meta = _meta(obj)
            if meta.get("deletionTimestamp") or not is_owned_by(obj, cluster_uid):
                continue
            if (api_version, kind, str(meta.get("name"))) not in wanted:
                out.append(obj)
    return out


class WriteMemo:
    """Writes the cache has not shown us yet, so a quick second pass does not repeat them.

    Keyed by object; holds the resourceVersion we observed when we wrote and a fingerprint of what we
    wrote. While the cache still shows that same resourceVersion, the same write is not repeated.
    Entries expire, so a lost watch event cannot suppress a needed write for long.
    """

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._entries: dict[tuple[str, str, str, str], tuple[str | None, str, float]] = {}

    def pending(self, ident: tuple[str, str, str, str], observed_rv: str | None, fingerprint: str) -> bool:
        entry = self._entries.get(ident)
        if entry is None:
            return False
        rv, fp, at = entry
        if rv != observed_rv or time.monotonic() - at > self.ttl:
            del self._entries[ident]
            return False
        return fp == fingerprint

    def seen(self, ident: tuple[str, str, str, str]) -> None:
        """The cache shows the object as we want it: the write (if any) arrived. Were the entry kept,
        the object deleted soon after would look like our create not yet seen, and stay missing."""
        self._entries.pop(ident, None)

    def wrote(self, ident: tuple[str, str, str, str], observed_rv: str | None, fingerprint: str) -> None:
        now = time.monotonic()
        if len(self._entries) > 4096:  # entries of deleted clusters are never looked up again
            self._entries = {k: v for k, v in self._entries.items() if now - v[2] <= self.ttl}
        self._entries[ident] = (observed_rv, fingerprint, now)


class Reconciler:
    def __init__(self, api: Api, cache: Cache, metrics: Metrics, events: EventRecorder) -> None:
        self.api = api
        self.cache = cache
        self.metrics = metrics
        self.instance_metrics = InstanceMetrics(metrics.registry)
        self.events = events
        self.memo = WriteMemo()
        self.dataplane = DataPlane(api, events)
        self._invalid_seen: dict[ClusterKey, int] = {}
        # A refused PVC growth, by claim: (its resourceVersion, the patch, the problem). While the memo
        # holds the patch back, the passes in between keep reporting it instead of flapping to Healthy.
        self._resize_refused: dict[tuple[str, str, str, str], tuple[str | None, str, Problem]] = {}
        # Clusters whose namespace refused a write because it is being deleted, by the cluster version
        # (cluster_mark) that was refused: the wake-ups the deletion itself causes (children going one by
        # one) make no more requests until the cluster object changes or goes.
        self._terminating: dict[ClusterKey, tuple[str, str]] = {}

    async def reconcile(self, key: ClusterKey) -> Outcome:
        started = time.perf_counter()
        try:
            return await self._reconcile(key)
        except ApiError as exc:
            if namespace_terminating(exc):
                mark = cluster_mark(self.cache.cluster(key))
                if mark is not None:
                    self._terminating[key] = mark
            raise
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)

    async def _apply_if_needed(
        self, namespace: str, desired: dict[str, Any], observed: dict[str, Any] | None
    ) -> bool:
        body = with_hash(desired)
        diffs = object_differences(body, observed)
        meta = body["metadata"]
        ident = (namespace, body["kind"], meta["name"], "apply")
        if not diffs:
            self.memo.seen(ident)
            return False
        rv = _meta(observed).get("resourceVersion")
        fingerprint = meta["annotations"][HASH_ANNOTATION]
        if self.memo.pending(ident, rv, fingerprint):
            return False
        log.info(
            "applying %s %s/%s (differs at %s)", body["kind"], namespace, meta["name"], ", ".join(diffs[:4])
        )
        await self.api.apply(body)
        self.memo.wrote(ident, rv, fingerprint)
        return True

    async def _apply_child(
        self, body: dict[str, Any], desired: dict[str, Any], snapshot: Snapshot, problem: Problem | None
    ) -> int:
        """Writes made for one desired child: none if it matches; the StatefulSet also records Events."""
        observed = snapshot.find(desired["apiVersion"], desired["kind"], desired["metadata"]["name"])
        is_sts = desired["kind"] == "StatefulSet"
        if is_sts and observed is None and problem is not None:
            return 0  # its PVCs could not be provisioned; create it once the problem is gone
        if not await self._apply_if_needed(_meta(body)["namespace"], desired, observed):
            return 0
        return 1 + (await self._statefulset_events(body, desired, observed) if is_sts else 0)

    async def _reconcile(self, key: ClusterKey) -> Outcome:
        namespace, name = key
        snapshot = self.cache.snapshot(key)
        body = snapshot.cluster
        if body is None or _meta(body).get("deletionTimestamp"):
            # Gone or going: the garbage collector removes the children through their ownerReferences.
            self.metrics.set_phase(key, None)
            self.instance_metrics.set(key, {}, {})
            self._invalid_seen.pop(key, None)
            self._terminating.pop(key, None)
            return Outcome(gone=True)
        refused_mark = self._terminating.get(key)
        if refused_mark is not None:
            if refused_mark == cluster_mark(body):
                return Outcome(gone=True)  # its namespace is being deleted; nothing was changed since
            del self._terminating[key]

        try:
            cluster = PostgresCluster.from_obj(body)
        except ValueError as exc:
            generation = int(_meta(body).get("generation") or 0)
            outcome = Outcome(problem=("InvalidSpec", str(exc)), phase="Invalid")
            if self._invalid_seen.get(key) != generation:
                self._invalid_seen[key] = generation
                await self.events.record(body, "Warning", "InvalidSpec", str(exc))
                outcome.writes += 1
            return outcome
        self._invalid_seen.pop(key, None)

        outcome = Outcome()
        spec = body.get("spec") or {}
        problem = storage_class_problem(spec, snapshot)
        outcome.problem = problem

        sts = snapshot.find("apps/v1", "StatefulSet", name)
        desired = desired_children(cluster, existing_statefulset=sts)
        if sts is not None:
            # Failover, switchover, rollout order and scale-down safety: Patroni's part is done by
            # Patroni, the rest here. It may hold the StatefulSet's size until the primary has moved.
            try:
                step = await self.dataplane.step(cluster, body, snapshot, sts)
            except ApiError as exc:
                # A refused action (say, RBAC) is reported, and must not keep the children and the
                # status from being reconciled; the next pass tries again.
                log.warning("%s/%s: data-plane action failed: %s", namespace, name, exc.status.message)
                step = StepResult(problem=("DataPlaneActionFailed", str(exc.status.message)))
            outcome.writes += step.writes
            problem = problem or step.problem
            outcome.problem = problem
            if step.replicas is not None:
                for child in desired:
                    if child["kind"] == "StatefulSet":
                        child["spec"]["replicas"] = step.replicas
        wanted: set[ObjectId] = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in desired}
        # Two waves of writes sent together: what depends on nothing, then what depends on the first
        # wave — the RoleBinding (the API server checks a binding against its Role, which must exist)
        # and the StatefulSet (its pods need the account, the configuration and the Secrets). A new
        # cluster's ~15 writes then cost two round trips instead of fifteen: at 1000 new clusters the
        # first passes were bound by the API server's latency, not by the operator's CPU.
        first = [c for c in desired if c["kind"] not in SECOND_WAVE]
        second = [c for c in desired if c["kind"] in SECOND_WAVE]
        outcome.writes += await all_of(
            [self._apply_child(body, c, snapshot, problem) for c in first]
            + [self._create_missing_secrets(cluster, snapshot, wanted)]
        )
        outcome.writes += await all_of([self._apply_child(body, c, snapshot, problem) for c in second])

        for obj in undesired_children(snapshot, cluster.uid, MANAGED_KINDS, wanted):
            meta = _meta(obj)
            gone = (namespace, str(obj.get("kind")), str(meta.get("name")), "delete")
            if self.memo.pending(gone, meta.get("resourceVersion"), ""):
                continue
            log.info("deleting %s %s/%s: no longer desired", obj.get("kind"), namespace, meta.get("name"))
            try:
                await self.api.delete(obj["apiVersion"], obj["kind"], str(meta["name"]), namespace)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            self.memo.wrote(gone, meta.get("resourceVersion"), "")
            outcome.writes += 1

        for pvc_name, patch in pvc_resizes(cluster, snapshot.of_kind("v1", "PersistentVolumeClaim")):
            ident4 = (namespace, "PersistentVolumeClaim", pvc_name, "resize")
            pvc = snapshot.find("v1", "PersistentVolumeClaim", pvc_name)
            rv = _meta(pvc).get("resourceVersion")
            if self.memo.pending(ident4, rv, _canonical(patch)):
                refused = self._resize_refused.get(ident4)
                if refused is not None and refused[:2] == (rv, _canonical(patch)):
                    problem = problem or refused[2]
                    outcome.problem = problem
                continue
            self._resize_refused.pop(ident4, None)
            log.info("growing PVC %s/%s", namespace, pvc_name)
            outcome.writes += 1
            try:
                await self.api.merge_patch(
                    resource_for("v1", "PersistentVolumeClaim"), pvc_name, namespace, patch
                )
            except ApiError as exc:
                if exc.status.code not in (403, 422):
                    raise
                # e.g. the StorageClass does not allow expansion: retrying soon will not help; report it
                refusal = (
                    "StorageResizeRefused",
                    f"PersistentVolumeClaim {pvc_name} cannot grow to spec.storage: {exc.status.message}",
                )
                self._resize_refused[ident4] = (rv, _canonical(patch), refusal)
                problem = problem or refusal
                outcome.problem = problem
            self.memo.wrote(ident4, rv, _canonical(patch))

        outcome.writes += await self._report(body, cluster, snapshot, sts, problem, outcome)
        return outcome

    async def _statefulset_events(
        self,
        body: dict[str, Any],
        desired: Mapping[str, Any],
        observed: Mapping[str, Any] | None,
    ) -> int:
        want = (desired.get("spec") or {}).get("replicas")
        if observed is None:
            ok = await self.events.record(
                body, "Normal", "Created", f"created StatefulSet with {want} instance(s)"
            )
            return int(ok)
        have = (observed.get("spec") or {}).get("replicas")
        if want is not None and have is not None and want != have:
            ok = await self.events.record(
                body, "Normal", "Scaled", f"scaling from {have} to {want} instance(s)"
            )
            return int(ok)
        return 0

    async def _create_missing_secrets(
        self, cluster: PostgresCluster, snapshot: Snapshot, wanted: set[ObjectId]
    ) -> int:
        names = secret_names(cluster)
        wanted.update(("v1", "Secret", n) for n in names)
        missing = [n for n in names if snapshot.find("v1", "Secret", n) is None]
        for present in set(names) - set(missing):
            self.memo.seen((cluster.namespace, "Secret", present, "create"))
        missing = [
            n for n in missing if not self.memo.pending((cluster.namespace, "Secret", n, "create"), None, "")
        ]
        if not missing:
            return 0

        async def create(secret: dict[str, Any]) -> int:
            secret_name = secret["metadata"]["name"]
            log.info("creating Secret %s/%s", cluster.namespace, secret_name)
            try:
                await self.api.create_dict(secret)
            except ApiError as exc:
                if not is_conflict(exc):  # already there (the cache had not caught up): create-only
                    raise
            self.memo.wrote((cluster.namespace, "Secret", secret_name, "create"), None, "")
            return 1

        # Passwords only exist in these objects and in the request body; never logged.
        secrets = build_secrets(cluster, ClusterPasswords.generate())
        return await all_of([create(s) for s in secrets if s["metadata"]["name"] in missing])

    async def _report(
        self,
        body: dict[str, Any],
        cluster: PostgresCluster,
        snapshot: Snapshot,
        sts: Mapping[str, Any] | None,
        problem: Problem | None,
        outcome: Outcome,
    ) -> int:
        previous = body.get("status") or None
        status = compute_status(
            cluster,
            previous=previous,
            statefulset=sts,
            pods=snapshot.of_kind("v1", "Pod"),
            now=datetime.now(UTC),
            problem=problem,
        )
        outcome.phase = str(status.get("phase") or "")
        self.metrics.set_phase((cluster.namespace, cluster.name), outcome.phase)
        self.instance_metrics.set(
            (cluster.namespace, cluster.name),
            replication_lag(cluster.name, snapshot.of_kind("v1", "Pod")),
            {str(i["name"]): int(i["timeline"]) for i in status.get("instances") or [] if "timeline" in i},
        )
        if _canonical(status) == _canonical(previous or {}):
            return 0
        ident = (cluster.namespace, "PostgresCluster", cluster.name, "status")
        rv = _meta(body).get("resourceVersion")
        if self.memo.pending(ident, rv, _canonical(status)):
            return 0
        try:
            await self.api.merge_patch(
                PostgresClusterResource,
                cluster.name,
                cluster.namespace,
                status_patch(previous, status),
                subresource_status=True,
            )
        except ApiError as exc:
            if is_not_found(exc):
                return 1
            raise
        self.memo.wrote(ident, rv, _canonical(status))
        writes = 1
        was_primary = str((previous or {}).get("currentPrimary") or "")
        primary = str(status.get("currentPrimary") or "")
        if was_primary and primary and primary != was_primary:
            writes += await self.events.record(
                body, "Warning", "PrimaryChanged", f"the primary moved from {was_primary} to {primary}"
            )
        was = (_condition(previous, "Degraded") or {}).get("status") == "True"
        now_degraded = _condition(status, "Degraded") or {}
        if now_degraded.get("status") == "True" and not was:
            reason = str(now_degraded.get("reason") or "Degraded")
            writes += await self.events.record(
                body, "Warning", reason, str(now_degraded.get("message") or reason)
            )
        elif was and now_degraded.get("status") != "True":
            writes += await self.events.record(
                body, "Normal", "Recovered", "the cluster is no longer degraded"
            )
        return writes
