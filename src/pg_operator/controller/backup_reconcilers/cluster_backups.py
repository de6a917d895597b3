"""A cluster's backup side: the object-store finalizer, ownership of its store prefix (checked before
anything is archived: the archive gate in the primary is opened only for a prefix the cluster owns),
continuous archiving (pg_stat_archiver on the primary, the store itself when archiving fails), retention
(only in a prefix the cluster owns), and the backup conditions and `status.backup` they give. Keyed like
the cluster, (namespace, name).

Clusters without `spec.backup` cost nothing but a look at the cached object (no exec, no request),
unless stale backup conditions must be cleared once.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shlex
import time
from collections.abc import Callable
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import BackupConfiguration
from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.backup import generations
from pg_operator.backup.archive_gate import GateState, gate_line, write_gate_script
from pg_operator.backup.archive_health import (
    ARCHIVER_QUERY,
    ArchiverStats,
    ArchivingCondition,
    archiving_condition,
    archiving_summary,
    last_backup_condition,
    parse_archiver_line,
)
from pg_operator.backup.archive_report import ArchiveReport, parse_report, settled
from pg_operator.backup.barman import ObjectStore, backup_list_argv
from pg_operator.backup.catalog import parse_time, records
from pg_operator.backup.failures import Failure, classify
from pg_operator.backup.from_spec import retention_policy
from pg_operator.backup.placement import primary_pod
from pg_operator.backup.retention import RetentionPolicy, next_change
from pg_operator.backup.store_cleanup import decide_finalizer
from pg_operator.backup.store_ownership import Verdict
from pg_operator.backup.store_policy import OWNERSHIP_STATUS_KEY, STORE_TIMEOUT
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.backup_reconcilers.cluster_status import ClusterWrites, Ours
from pg_operator.controller.backup_reconcilers.ownership import StoreOwnership
from pg_operator.controller.backup_reconcilers.retention_enforcement import Retention
from pg_operator.controller.backup_reconcilers.shared import (
    PSQL,
    Notices,
    again,
    backup_config,
    store_of,
)
from pg_operator.controller.backup_reconcilers.store_finalizer import StoreFinalizer
from pg_operator.controller.cache import Cache
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.kube_api import Api
from pg_operator.controller.loop import Result
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.pod_exec import ExecError, PodExec
from pg_operator.controller.store_calls import BUSY_RETRY_SECONDS, slot
from pg_operator.controller.store_client import StoreBusy, StoreError, StoreRefused, StoreTimeout
from pg_operator.controller.store_limits import limits
from pg_operator.controller.writes import canonical
from pg_operator.specs.backup_status import BACKUP_CONDITION_TYPES, BACKUP_STATUS_KEY

log = logging.getLogger(__name__)

# The last probe of a cluster's pods: (primary, gate written, stats, store failure, monotonic time).
Probe = tuple[str | None, GateState | None, ArchiverStats | None, Failure | None, float]
# What the condition says while the prefix is someone else's (the gate discards WAL meanwhile).
NOT_ARCHIVED = (
    " WAL is not archived meanwhile: the primary recycles its segments (no point-in-time recovery), "
    "so pg_wal does not grow"
)


def _archiving(
    halted_by: Failure | None,
    verdict: Verdict | None,
    stats: ArchiverStats | None,
    failure: Failure | None,
    primary: str | None,
) -> ArchivingCondition:
    """ContinuousArchiving: a store halted (refused, out of time) or owned elsewhere says so; otherwise
    what the primary's archiver shows."""
    if halted_by is not None:
        return ArchivingCondition("False", halted_by.reason, halted_by.message)
    if verdict is not None and not verdict.ours:
        return ArchivingCondition("False", verdict.reason, verdict.message + "." + NOT_ARCHIVED)
    return archiving_condition(stats, store_failure=failure, primary=primary)


class ClusterBackupReconciler:
    def __init__(
        self,
        api: Api,
        cache: Cache,
        metrics: Metrics,
        pod_exec: PodExec,
        notices: Notices,
        ownership: StoreOwnership,
        *,
        backoff: Backoff,
        clock: Callable[[], dt.datetime],
        archive_check_seconds: float = 30.0,
        retention_seconds: float = 600.0,
        min_probe_seconds: float = 10.0,
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.exec = pod_exec
        self.notices = notices
        self.clock = clock
        self.archive_check_seconds = archive_check_seconds
        self.retention_seconds = retention_seconds
        self.min_probe_seconds = min_probe_seconds
        self.ownership = ownership
        self.writes = ClusterWrites(api, clock)
        self.finalizer = StoreFinalizer(api, self.writes, notices, backoff, ownership)
        self.retention = Retention(api, cache, pod_exec, notices, clock)
        # Per cluster with a retention policy: the policy retention last ran for, and when it is due again
        # (a timestamp; None: only once a backup completes or the policy changes).
        self._retention_next: dict[ClusterKey, tuple[RetentionPolicy, float | None]] = {}
        self._failing: set[ClusterKey] = set()  # clusters whose primary reports archiving failing
        self._probes: dict[ClusterKey, Probe] = {}
        self._gates: dict[ClusterKey, GateState] = {}  # the last gate written, per cluster
        # From the primary's report: the last gate write ((pod, gate), monotonic time) and the last time
        # the store was asked why archiving fails (with its answer).
        self._gate_writes: dict[ClusterKey, tuple[tuple[str, GateState], float]] = {}
        self._store_asked: dict[ClusterKey, tuple[float, Failure | None]] = {}
        # Per cluster whose store ran out of time: calls in a row, the `spec.backup` they were for, when
        # (monotonic) the store may be asked again, and the failure reported meanwhile.
        self._timeouts: dict[ClusterKey, tuple[int, str, float, Failure]] = {}
        self.backoff = backoff

    def retention_due(self, key: ClusterKey) -> None:
        """A backup of the cluster completed: retention runs on its next reconcile."""
        self._retention_next.pop(key, None)

    def _forget(self, key: ClusterKey) -> None:
        self.metrics.forget_archive(key)
        self._probes.pop(key, None)
        self._retention_next.pop(key, None)
        self._failing.discard(key)
        self._gates.pop(key, None)
        self._gate_writes.pop(key, None)
        self._store_asked.pop(key, None)
        self._timeouts.pop(key, None)
        self.notices.forget(key)
        self.ownership.drop(key)

    async def reconcile(self, key: ClusterKey) -> Result:
        namespace, name = key
        body = self.cache.cluster(key)
        if body is None:
            self._forget(key)
            return Result(gone=True)
        snapshot = self.cache.snapshot(key)
        pods = [p for p in snapshot.of_kind("v1", "Pod") if objects.label(p, CLUSTER_LABEL) == name]
        # Not only the instances the snapshot shows: once the finalizer deleted the StatefulSet, its pods
        # are no one's instances, yet still stopping (and archiving their last WAL).
        stopping = [p for p in self.cache.pods_held(key) if objects.label(p, CLUSTER_LABEL) == name]
        decision = decide_finalizer(
            body,
            statefulset_exists=snapshot.find("apps/v1", "StatefulSet", name) is not None,
            pods_left=len(stopping),
            now=self.clock(),
        )
        if decision.action != "none":
            return again(await self.finalizer.step(key, body, decision.action, decision.why))
        try:
            config = backup_config(body)
        except ValueError as exc:
            log.info("cluster %s/%s: spec.backup invalid, skipping backups: %s", namespace, name, exc)
            return again(None)
        if config is None:
            await self.writes.status(body, {t: None for t in BACKUP_CONDITION_TYPES}, None)
            self.metrics.forget_archive(key)
            return again(None)
        primary = primary_pod(pods, name)
        report = next((parse_report(objects.meta(p).get("annotations")) for p in pods
                       if objects.name(p) == primary), None)  # fmt: skip
        store = store_of(body, config)
        try:
            verdict, owner_failure = await self._ownership(key, body, config, store)
        except StoreBusy:
            # Another store call of this namespace is in flight: nothing new to say, come back soon.
            return again(BUSY_RETRY_SECONDS)
        gate: GateState | None = None if verdict is None else "archive" if verdict.ours else "discard"
        # A refused store (nothing may be sent to it) or one that ran out of time is not asked again
        # from the pods on this reconcile either.
        halted = owner_failure is not None and owner_failure.exit_status < 0
        stats: ArchiverStats | None = None
        store_failure: Failure | None = None
        if halted:
            pass
        elif report is not None and primary is not None:
            stats, store_failure = await self._reported(key, primary, store, config, gate, report)
        else:  # an instance of an older image, or none published yet: ask the primary itself
            stats, store_failure = await self._archiving(key, primary, store, config, gate)
        self._doubt_ownership(key, stats)
        previous = (objects.status(body).get(BACKUP_STATUS_KEY) or {}).get("archiving")
        if stats is not None:
            stats = settled(stats, primary, previous)
        failure = store_failure or owner_failure
        archiving = _archiving(owner_failure if halted else None, verdict, stats, failure, primary)
        return await self._report(key, body, store, archiving, gate, stats, primary)

    async def _report(
        self,
        key: ClusterKey,
        body: dict[str, Any],
        store: ObjectStore,
        archiving: ArchivingCondition,
        gate: GateState | None,
        stats: ArchiverStats | None,
        primary: str | None,
    ) -> Result:
        """The conditions and `status.backup`, the metrics and Events; when to come back."""
        ours: Ours = {"ContinuousArchiving": archiving.as_tuple(), "BackupStoreCleanup": None}
        mine = self.cache.backups(key)
        # After an in-place major upgrade the newest generation needs its own base backup before a
        # restore to a time after the upgrade is possible: until then the condition says so.
        last = generations.backup_gap(generations.of_cluster(body), mine) or last_backup_condition(mine)
        if last is not None:
            ours["LastBackupSucceeded"] = last
        # Segments the gate discarded count as archived in pg_stat_archiver: no figures while the pod's
        # gate may say discard (also when the store cannot be asked now and it said so last time).
        if gate is not None:
            self._gates[key] = gate
        discarding = self._gates.get(key) == "discard"
        shown = None if discarding else stats
        summary = self._summary(body, shown, primary, mine, keep_old=not discarding)
        record = self.ownership.record(key, body, store)
        if record is not None:
            summary[OWNERSHIP_STATUS_KEY] = record.to_status()
        finished = parse_time(summary.get("lastSuccessfulBackupTime"))
        self.metrics.set_backups(key, None if finished is None else finished.timestamp(),
                                 None if last is None else last[0] == "True")  # fmt: skip
        await self.writes.status(body, ours, summary or None)
        if archiving.status == "False" and archiving.reason != "NothingArchivedYet":
            await self.notices.once(
                key, body, "Warning", archiving.reason, f"ContinuousArchiving: {archiving.message}"
            )
        elif archiving.status == "True" and self.notices.sent(key, "Warning"):
            self.notices.reset(key, "Warning")
            await self.notices.post(body, "Normal", "ArchivingResumed", archiving.message)
        waiting = self._timeouts.get(key)
        if waiting is not None:  # retried with backoff, not at the usual pace
            return again(max(1.0, waiting[2] - time.monotonic()))
        return again(self.archive_check_seconds)

    def _doubt_ownership(self, key: ClusterKey, stats: ArchiverStats | None) -> None:
        """The store's marker is read again on the reconcile after the primary's archiving starts failing:
        another cluster's WAL in the prefix is one reason barman-cloud-wal-archive refuses a segment."""
        failing = stats is not None and stats.failing
        if failing and key not in self._failing:
            self.ownership.forget(key)
        if failing:
            self._failing.add(key)
        else:
            self._failing.discard(key)

    async def _ownership(
        self, key: ClusterKey, body: dict[str, Any], config: BackupConfiguration, store: ObjectStore
    ) -> tuple[Verdict | None, Failure | None]:
        """Whether the cluster owns its store prefix (claiming or adopting it when it may); None and the
        store's failure when the store cannot tell. A store that ran out of time is not asked again before
        its backoff passes (a status write wakes the reconcile sooner), unless `spec.backup` changed."""
        written = canonical(objects.spec(body).get("backup"))
        waiting = self._timeouts.get(key)
        if waiting is not None and waiting[1] == written and time.monotonic() < waiting[2]:
            return None, waiting[3]
        try:
            verdict = await self.ownership.check(body, config, store)
        except StoreBusy:
            raise
        except StoreRefused as exc:
            # Nothing was sent; exit_status -1 marks a failure the reconcile does not ask the pods about.
            log.info("cluster %s/%s: %s", key[0], key[1], exc.refusal.message)
            return None, Failure(exc.refusal.reason, exc.refusal.message, -1)
        except StoreTimeout as exc:
            failures = (waiting[0] if waiting is not None and waiting[1] == written else 0) + 1
            delay = self.backoff.delay(failures)
            where = store.endpoint_url or "AWS S3"
            message = (f"the object store {where} ({store.destination_url}) did not answer within "
                       f"{limits().call_seconds:.0f} s: {exc}; asked again with backoff ({failures} "
                       "time(s) in a row)")  # fmt: skip
            failure = Failure(STORE_TIMEOUT, message, -1)
            self._timeouts[key] = (failures, written, time.monotonic() + delay, failure)
            log.info("cluster %s/%s: store call timed out (%d in a row)", key[0], key[1], failures)
            return None, failure
        except StoreError as exc:
            self._timeouts.pop(key, None)
            log.info("cluster %s/%s: store prefix ownership unknown: %s", key[0], key[1], exc)
            return None, classify(1, str(exc))
        self._timeouts.pop(key, None)
        if verdict.kind in ("claim", "adopt"):
            await self.notices.post(body, "Normal", verdict.reason, verdict.message)
        elif not verdict.ours:
            text = verdict.message + "." + NOT_ARCHIVED
            await self.notices.once(key, body, "Warning", verdict.reason, text)
        return verdict, None

    @staticmethod
    def _summary(
        body: dict[str, Any],
        stats: ArchiverStats | None,
        primary: str | None,
        mine: list[dict[str, Any]],
        *,
        keep_old: bool = True,
    ) -> dict[str, Any]:
        summary: dict[str, Any] = {}
        if stats is not None:
            summary["archiving"] = archiving_summary(stats, primary)
        elif keep_old and (objects.status(body).get(BACKUP_STATUS_KEY) or {}).get("archiving"):
            summary["archiving"] = body["status"][BACKUP_STATUS_KEY]["archiving"]
        recorded = generations.of_cluster(body)
        if recorded:
            summary["generations"] = [g.to_mapping() for g in recorded]
        done = [b for b in mine if objects.status(b).get("phase") == "Completed"]
        if done:
            newest = max(done, key=lambda b: str(objects.status(b).get("stoppedAt") or ""))
            summary["lastSuccessfulBackup"] = objects.name(newest)
            summary["lastSuccessfulBackupTime"] = objects.status(newest).get("stoppedAt")
        return summary

    async def _reported(
        self,
        key: ClusterKey,
        primary: str,
        store: ObjectStore,
        config: BackupConfiguration,
        gate: GateState | None,
        report: ArchiveReport,
    ) -> tuple[ArchiverStats | None, Failure | None]:
        """Archive health from the primary's own report (no exec while it shows the right gate and
        archiving works). The gate is written when the report shows another one, at most once per
        `min_probe_seconds` (the instance republishes within seconds); the store is asked why when
        archiving fails or nothing was archived yet, at most once per `archive_check_seconds`; retention
        when due."""
        namespace, _ = key
        stats = report.stats
        clock = time.monotonic()
        if gate is not None and report.gate != gate_line(gate, store):
            last = self._gate_writes.get(key)
            if last is None or last[0] != (primary, gate) or clock - last[1] >= self.min_probe_seconds:
                self._gate_writes[key] = ((primary, gate), clock)
                try:
                    await self.exec.sh(namespace, primary, write_gate_script(gate, store), seconds=30)
                except ExecError as exc:
                    log.info("cluster %s/%s: archive gate not written on %s: %s", *key, primary, exc)
        if stats.last_archived_time is not None:
            self.metrics.set_last_archived(key, stats.last_archived_time.timestamp())
        due_retention = self._due_retention(key, config, gate)
        asked = self._store_asked.get(key)
        if not (stats.failing or stats.archived_count == 0 or due_retention):
            self._store_asked.pop(key, None)
            return stats, None
        if asked is not None and clock - asked[0] < self.archive_check_seconds and not due_retention:
            return stats, asked[1]
        store_failure = await self._ask_store(key, primary, store, config, due_retention)
        self._store_asked[key] = (clock, store_failure)
        return stats, store_failure

    async def _ask_store(
        self,
        key: ClusterKey,
        primary: str,
        store: ObjectStore,
        config: BackupConfiguration,
        due_retention: bool,
    ) -> Failure | None:
        """The store listed from the primary (its failure says why archiving fails), then retention when
        due (attempted now: a failing store is not listed on every wake-up for it)."""
        namespace, name = key
        policy = retention_policy(config.retention) if config.retention is not None else None
        now = self.clock()
        if due_retention and policy is not None:
            # Until it succeeds, retention is tried again after retention_seconds (a failing store is not
            # listed on every wake-up for it).
            self._retention_next[key] = (policy, now.timestamp() + self.retention_seconds)
        listing, store_failure = await self._list_backups(namespace, primary, store)
        if listing is not None and due_retention and policy is not None:
            body = self.cache.cluster(key) or {"metadata": {"name": name, "namespace": namespace}}
            if await self.retention.enforce(body, primary, store, config, listing):
                upcoming = next_change(records(listing), policy, now)
                self._retention_next[key] = (policy, None if upcoming is None else upcoming.timestamp())
        return store_failure

    def _due_retention(self, key: ClusterKey, config: BackupConfiguration, gate: GateState | None) -> bool:
        """Retention runs when what it would delete may have changed, never on a timer of its own: on the
        first reconcile (after the operator starts), after a backup completes (retention_due), when the policy
        changes, when a recovery window passes the end of a listed backup, and again after a failure."""
        if gate != "archive" or config.retention is None:
            return False
        known = self._retention_next.get(key)
        if known is None or known[0] != retention_policy(config.retention):
            return True
        return known[1] is not None and self.clock().timestamp() >= known[1]

    async def _archiving(
        self,
        key: ClusterKey,
        primary: str | None,
        store: ObjectStore,
        config: BackupConfiguration,
        gate: GateState | None,
    ) -> tuple[ArchiverStats | None, Failure | None]:
        """The last probe when it is recent, its primary and gate the same and no retention is due
        (woken again soon by a status write or a pod event: the pod is not asked again); else a new
        probe, which also writes the gate. Retention runs only in a prefix the cluster owns."""
        clock = time.monotonic()
        cached = self._probes.get(key)
        due_retention = self._due_retention(key, config, gate)
        if (
            cached is not None
            and cached[0] == primary
            and cached[1] == gate
            and clock - cached[4] < self.min_probe_seconds
            and not due_retention
        ):
            return cached[2], cached[3]
        stats, store_failure = await self._probe(key, primary, store, config, due_retention, gate)
        self._probes[key] = (primary, gate, stats, store_failure, clock)
        return stats, store_failure

    async def _probe(
        self,
        key: ClusterKey,
        primary: str | None,
        store: ObjectStore,
        config: BackupConfiguration,
        due_retention: bool,
        gate: GateState | None,
    ) -> tuple[ArchiverStats | None, Failure | None]:
        """The gate written and pg_stat_archiver read on the primary (one exec); the store itself
        (backup-list) when archiving fails or retention is due; retention when due."""
        namespace, name = key
        if primary is None:
            return None, None
        stats: ArchiverStats | None = None
        try:
            stats = await self._archiver_stats(namespace, primary, store, gate)
        except (ExecError, ValueError) as exc:
            log.info("cluster %s/%s: pg_stat_archiver unreadable on %s: %s", namespace, name, primary, exc)
        if stats is not None and stats.last_archived_time is not None:
            self.metrics.set_last_archived(key, stats.last_archived_time.timestamp())
        store_failure: Failure | None = None
        # The store is asked too when nothing was archived yet: a broken store is reported before
        # the first segment is even complete.
        if stats is None or stats.failing or stats.archived_count == 0 or due_retention:
            store_failure = await self._ask_store(key, primary, store, config, due_retention)
        return stats, store_failure

    async def _archiver_stats(
        self, namespace: str, pod: str, store: ObjectStore, gate: GateState | None
    ) -> ArchiverStats:
        psql = [*PSQL, "-F", "|", "-c", ARCHIVER_QUERY]
        if gate is None:
            result = await self.exec.run(namespace, pod, psql, seconds=30)
        else:  # the gate is rewritten on every probe: a restarted container or a new primary gets it
            script = f"{write_gate_script(gate, store)} && exec {shlex.join(psql)}"
            result = await self.exec.sh(namespace, pod, script, seconds=30)
        if result.exit_status != 0:
            raise ExecError(f"psql exited {result.exit_status}: {result.stderr.strip()[-300:]}")
        return parse_archiver_line(result.stdout.strip().splitlines()[-1])

    async def _list_backups(
        self, namespace: str, pod: str, store: ObjectStore
    ) -> tuple[dict[str, Any] | None, Failure | None]:
        """barman-cloud-backup-list in the pod: the catalog for retention, and a probe of the store (its
        failure, classified, says why archiving fails)."""
        try:
            async with slot(namespace):
                result = await self.exec.run(namespace, pod, backup_list_argv(store),
                                             seconds=limits().listing_seconds)  # fmt: skip
        except StoreBusy:
            return None, None  # the namespace's store is busy: listed on a later reconcile
        except ExecError as exc:
            log.info("backup list in %s/%s failed: %s", namespace, pod, exc)
            return None, None
        if result.exit_status != 0:
            return None, classify(result.exit_status, result.output)
        try:
            return json.loads(result.stdout), None
        except ValueError:
            return None, classify(1, result.output)
