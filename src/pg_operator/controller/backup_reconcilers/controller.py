"""The backup controller: Backups, ScheduledBackups, and each cluster's archiving, retention, backup
conditions and object-store finalizer.

It has its own work queue, keyed (kind, namespace, name), and its own workers, so a slow store or a
failing exec never holds up a cluster's own reconcile; every failure here is retried with backoff and
reported, never raised into the operator. Clusters without `spec.backup` cost nothing but a look at the
cached object (no exec, no request), unless stale backup conditions must be cleared once.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator.api.backup import BACKUP_KIND, BackupConfiguration
from pg_operator.api.constants import CLUSTER_LABEL, GROUP, PG_PORT, SUPERUSER, VERSION
from pg_operator.backup import jobs
from pg_operator.backup.archive_health import (
    ARCHIVER_QUERY,
    ArchiverStats,
    archiving_condition,
    archiving_summary,
    last_backup_condition,
    parse_archiver_line,
)
from pg_operator.backup.barman import (
    ObjectStore,
    backup_list_argv,
    backup_show_argv,
    base_backup_argv,
    delete_backup_argv,
)
from pg_operator.backup.catalog import backup_status, records
from pg_operator.backup.failures import Failure, classify
from pg_operator.backup.lifecycle import after_poll, before_start
from pg_operator.backup.placement import choose_instance, primary_pod
from pg_operator.backup.retention import BackupRecord, obsolete_backups, retired_backup_objects
from pg_operator.backup.scheduling import rfc3339, schedule_pass
from pg_operator.backup.store_cleanup import (
    FINALIZER,
    decide_finalizer,
    finalizers_with,
    finalizers_without,
)
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.backup_reconcilers.resources import BackupResource, ScheduledBackupResource
from pg_operator.controller.backup_reconcilers.store import StoreAccess, StoreError, delete_prefix
from pg_operator.controller.cache import Cache
from pg_operator.controller.events import event_body
from pg_operator.controller.kube_api import Api, PostgresClusterResource, is_conflict, is_not_found
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.pod_exec import ExecError, PodExec
from pg_operator.controller.workqueue import WorkQueue
from pg_operator.specs.backup_status import BACKUP_CONDITION_TYPES, BACKUP_STATUS_KEY

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # ("Backup" | "ScheduledBackup" | "Cluster", namespace, name)
SOCKET_DIR = "/var/run/postgresql"
PSQL = ["psql", "-h", SOCKET_DIR, "-U", SUPERUSER, "-d", "postgres", "-AtX", "-v", "ON_ERROR_STOP=1"]


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def _name(obj: Mapping[str, Any] | None) -> str:
    return str(_meta(obj).get("name") or "")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def backup_config(cluster: Mapping[str, Any] | None) -> BackupConfiguration | None:
    raw = ((cluster or {}).get("spec") or {}).get("backup")
    if not raw:
        return None
    return BackupConfiguration.model_validate(raw)


def store_of(cluster: Mapping[str, Any], config: BackupConfiguration) -> ObjectStore:
    return config.archive_settings(_name(cluster)).store


def merged_conditions(
    previous: Mapping[str, Any] | None,
    ours: dict[str, tuple[str, str, str] | None],
    *,
    generation: int,
    stamp: str,
) -> list[dict[str, Any]]:
    """The cluster's conditions with ours set (None: removed); others untouched, transition times kept
    while a condition's status holds."""
    old = [dict(c) for c in (previous or {}).get("conditions") or ()]
    by_type = {str(c.get("type")): c for c in old}
    out = [c for c in old if c.get("type") not in BACKUP_CONDITION_TYPES]
    for type_ in BACKUP_CONDITION_TYPES:
        if type_ not in ours:  # not this pass's business: kept as it is
            if type_ in by_type:
                out.append(by_type[type_])
            continue
        value = ours[type_]
        if value is None:  # no longer applies
            continue
        status, reason, message = value
        before = by_type.get(type_)
        since = stamp
        if before and before.get("status") == status and before.get("lastTransitionTime"):
            since = str(before["lastTransitionTime"])
        out.append({"type": type_, "status": status, "reason": reason, "message": message[:32768],
                    "observedGeneration": generation, "lastTransitionTime": since})  # fmt: skip
    return out


class BackupController:
    def __init__(
        self,
        api: Api,
        cache: Cache,
        metrics: Metrics,
        pod_exec: PodExec,
        identity: str,
        *,
        workers: int = 4,
        archive_check_seconds: float = 30.0,
        retention_seconds: float = 600.0,
        min_probe_seconds: float = 10.0,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        backoff: Backoff | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.metrics = metrics
        self.exec = pod_exec
        self.identity = identity
        self.workers = workers
        self.archive_check_seconds = archive_check_seconds
        self.retention_seconds = retention_seconds
        self.clock = clock
        self.backoff = backoff or Backoff(base=2.0, cap=300.0)
        self.queue: WorkQueue[Key] = WorkQueue()
        self.failures: dict[Key, int] = {}
        self.backups: dict[tuple[str, str], dict[str, Any]] = {}
        self.scheduled: dict[tuple[str, str], dict[str, Any]] = {}
        self._retention_at: dict[tuple[str, str], float] = {}
        self._events_sent: dict[tuple[Key, str], str] = {}
        # Per cluster: (primary, stats, store failure, monotonic time) of the last probe of its pods.
        self._probes: dict[
            tuple[str, str], tuple[str | None, ArchiverStats | None, Failure | None, float]
        ] = {}
        self.min_probe_seconds = min_probe_seconds

    # --- wake-ups (from kopf's event handlers) ------------------------------------------------------

    def on_backup(self, body: Mapping[str, Any], event_type: str | None) -> None:
        ident = (str(_meta(body).get("namespace")), _name(body))
        if event_type == "DELETED":
            self.backups.pop(ident, None)
        else:
            self.backups[ident] = dict(body)
            self.queue.add(("Backup", *ident))
        cluster = str((body.get("spec") or {}).get("cluster") or "")
        if cluster:
            self.queue.add_after(("Cluster", ident[0], cluster), 1.0)

    def on_scheduled_backup(self, body: Mapping[str, Any], event_type: str | None) -> None:
        ident = (str(_meta(body).get("namespace")), _name(body))
        if event_type == "DELETED":
            self.scheduled.pop(ident, None)
            return
        self.scheduled[ident] = dict(body)
        self.queue.add(("ScheduledBackup", *ident))

    def on_cluster(self, body: Mapping[str, Any]) -> None:
        meta = _meta(body)
        if (
            (body.get("spec") or {}).get("backup")
            or FINALIZER in (meta.get("finalizers") or ())
            or any(
                c.get("type") in BACKUP_CONDITION_TYPES
                for c in (body.get("status") or {}).get("conditions") or ()
            )
        ):
            self.queue.add_after(("Cluster", str(meta.get("namespace")), _name(body)), 0.5)

    # --- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.queue.run_workers(self.handle, self.workers)

    async def close(self) -> None:
        self.queue.close()
        await self.exec.close()

    async def handle(self, key: Key) -> None:
        kind = key[0]
        try:
            if kind == "Backup":
                again = await self.backup_pass(key[1], key[2])
            elif kind == "ScheduledBackup":
                again = await self.scheduled_pass(key[1], key[2])
            else:
                again = await self.cluster_pass(key[1], key[2])
        except Exception as exc:
            failures = self.failures.get(key, 0) + 1
            self.failures[key] = failures
            delay = self.backoff.delay(failures)
            log.warning("backup pass %s %s/%s failed (%d in a row), retrying in %.0fs: %s: %s",
                        kind, key[1], key[2], failures, delay, type(exc).__name__, exc)  # fmt: skip
            self.queue.add_after(key, delay)
            return
        self.failures.pop(key, None)
        if again is not None:
            self.queue.add_after(key, again)

    async def _event(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        try:
            from lightkube import codecs

            body = event_body(dict(obj), event_type, reason, message, self.identity)
            await self.api.create(codecs.from_dict(body))
        except Exception as exc:  # an Event must never fail a pass
            log.warning("could not post %s event %s: %s", event_type, reason, exc)

    async def _event_once(
        self, key: Key, obj: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        """One Event per (object, reason) until the reason changes: a failing store retried every
        minute does not flood the namespace."""
        slot = (key, event_type)
        if self._events_sent.get(slot) == reason:
            return
        self._events_sent[slot] = reason
        await self._event(obj, event_type, reason, message)

    # --- Backup -----------------------------------------------------------------------------------

    async def _write_backup_status(self, body: dict[str, Any], fields: Mapping[str, Any]) -> None:
        current = dict(body.get("status") or {})
        wanted = {**current, **fields}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        if _canonical(wanted) == _canonical(current):
            return
        meta = _meta(body)
        patch = {"status": {**{k: None for k in current if k not in wanted}, **wanted}}
        await self.api.merge_patch(
            BackupResource, str(meta["name"]), str(meta["namespace"]), patch, subresource_status=True
        )
        body["status"] = wanted  # until the watch brings the new object

    async def backup_pass(self, namespace: str, name: str) -> float | None:
        body = self.backups.get((namespace, name))
        if body is None or _meta(body).get("deletionTimestamp"):
            return None
        status = dict(body.get("status") or {})
        if status.get("phase") in ("Completed", "Failed"):
            return None
        now = rfc3339(self.clock())
        cluster_name = str((body.get("spec") or {}).get("cluster") or "")
        cluster = self.cache.cluster((namespace, cluster_name))
        pods = self.cache.snapshot((namespace, cluster_name)).of_kind("v1", "Pod")
        key: Key = ("Backup", namespace, name)
        step = before_start(
            status, cluster=cluster, placement=choose_instance(pods, cluster_name), now_stamp=now
        )
        if step.kind == "done":
            return None
        if step.kind in ("fail", "wait"):
            await self._write_backup_status(body, step.status)
            if step.kind == "fail":
                await self._backup_failed(key, body, cluster, step.reason, step.message)
            return step.requeue
        config = backup_config(cluster) if cluster is not None else None
        if cluster is None or config is None:
            # Running, and the cluster or its spec.backup went away meanwhile.
            reason = "ClusterNotFound" if cluster is None else "BackupNotConfigured"
            message = "the cluster or its spec.backup went away while the backup ran"
            await self._write_backup_status(
                body, {"phase": "Failed", "error": f"{reason}: {message}", "stoppedAt": now}
            )
            await self._backup_failed(key, body, cluster, reason, message)
            return None
        store = store_of(cluster, config)
        if step.kind == "start":
            assert step.pod
            await self._write_backup_status(
                body,
                {**step.status, "serverName": store.server_name, "destinationPath": store.destination_url},
            )
            await self._start_job(namespace, step.pod, name, store)
            await self._event(body, "Normal", "Started", step.message)
            return 10.0
        # Running: watch the job in its pod.
        pod = str(status.get("instance") or "")
        if not any(_name(p) == pod for p in pods):
            message = f"the instance {pod or '(none)'} that ran the backup is gone"
            await self._write_backup_status(
                body, {"phase": "Failed", "error": f"BackupInterrupted: {message}", "stoppedAt": now}
            )
            await self._backup_failed(key, body, cluster, "BackupInterrupted", message)
            return None
        result = await self.exec.sh(namespace, pod, jobs.poll_script(name), seconds=30)
        if result.exit_status != 0:
            raise ExecError(
                f"polling the backup job in {pod} exited {result.exit_status}: {result.stderr[-300:]}"
            )
        polled = after_poll(jobs.parse_poll(result.stdout), now_stamp=now)
        if polled.kind == "wait":
            return polled.requeue
        if polled.kind == "start":
            await self._start_job(namespace, pod, name, store)
            return 10.0
        if polled.kind == "fail":
            await self._write_backup_status(body, polled.status)
            await self._cleanup_job(namespace, pod, name)
            await self._backup_failed(key, body, cluster, polled.reason, polled.message)
            return None
        # Exited 0: what barman recorded.
        shown = await self.exec.run(namespace, pod, backup_show_argv(store, name), seconds=120)
        if shown.exit_status != 0:
            failure = classify(shown.exit_status, shown.output)
            raise ExecError(f"barman-cloud-backup-show: {failure.message}")
        fields = backup_status(json.loads(shown.stdout))
        await self._write_backup_status(body, {**fields, "error": fields.get("error")})
        await self._cleanup_job(namespace, pod, name)
        if fields.get("phase") == "Completed":
            await self._after_standby_backup(namespace, cluster_name, pod, pods)
            size = fields.get("size")
            message = f"base backup {fields.get('backupID')} completed on {pod} ({size} bytes)"
            await self._event(body, "Normal", "Completed", message)
            self._retention_at.pop((namespace, cluster_name), None)  # retention runs on the next pass
        elif fields.get("phase") == "Failed":
            await self._backup_failed(key, body, cluster, "BackupFailed", str(fields.get("error")))
        self.queue.add_after(("Cluster", namespace, cluster_name), 1.0)
        return None

    async def _backup_failed(
        self, key: Key, body: Mapping[str, Any], cluster: Mapping[str, Any] | None, reason: str, message: str
    ) -> None:
        await self._event(body, "Warning", reason, f"Backup {key[2]} failed: {message}")
        if cluster is not None:
            await self._event(
                cluster, "Warning", "BackupFailed", f"Backup {key[2]} failed: {reason}: {message}"
            )
            self.queue.add_after(("Cluster", key[1], _name(cluster)), 1.0)

    async def _start_job(self, namespace: str, pod: str, name: str, store: ObjectStore) -> None:
        argv = base_backup_argv(store, name=name, host=SOCKET_DIR, port=PG_PORT, user=SUPERUSER)
        result = await self.exec.sh(namespace, pod, jobs.start_script(name, argv), seconds=30)
        if result.exit_status != 0 or result.stdout.strip() not in ("started", "already-started"):
            raise ExecError(
                f"starting the backup in {pod} failed (exit {result.exit_status}): {result.stderr[-300:]}"
            )
        log.info("backup %s/%s: %s on %s", namespace, name, result.stdout.strip(), pod)

    async def _cleanup_job(self, namespace: str, pod: str, name: str) -> None:
        try:
            await self.exec.sh(namespace, pod, jobs.cleanup_script(name), seconds=30)
        except ExecError as exc:
            log.info("could not remove the job files of %s in %s: %s", name, pod, exc)

    async def _after_standby_backup(
        self, namespace: str, cluster: str, pod: str, pods: list[dict[str, Any]]
    ) -> None:
        """A backup taken on a replica ends in a WAL segment the primary has not finished: switch it,
        so the segment is archived now and the backup is restorable at once."""
        primary = primary_pod(pods, cluster)
        if primary is None or primary == pod:
            return
        try:
            await self.exec.run(namespace, primary, [*PSQL, "-c", "SELECT pg_switch_wal()"], seconds=30)
        except ExecError as exc:
            log.info("WAL switch on %s after a standby backup failed: %s", primary, exc)

    # --- ScheduledBackup --------------------------------------------------------------------------

    async def scheduled_pass(self, namespace: str, name: str) -> float | None:
        body = self.scheduled.get((namespace, name))
        if body is None or _meta(body).get("deletionTimestamp"):
            return None
        sp = schedule_pass(body, self.clock())
        if sp.backup is not None:
            try:
                await self.api.create_dict(sp.backup)
                log.info(
                    "ScheduledBackup %s/%s created Backup %s", namespace, name, sp.backup["metadata"]["name"]
                )
                await self._event(
                    body, "Normal", "BackupCreated", f"created Backup {sp.backup['metadata']['name']}"
                )
            except ApiError as exc:
                if not is_conflict(exc):
                    raise
        current = dict(body.get("status") or {})
        if _canonical(current) != _canonical(sp.status):
            await self.api.merge_patch(
                ScheduledBackupResource, name, namespace, {"status": sp.status}, subresource_status=True
            )
            body["status"] = sp.status
        return sp.requeue

    # --- the cluster: finalizer, archiving, retention, conditions ----------------------------------

    async def cluster_pass(self, namespace: str, name: str) -> float | None:
        body = self.cache.cluster((namespace, name))
        key: Key = ("Cluster", namespace, name)
        if body is None:
            self.metrics.forget_archive((namespace, name))
            self._probes.pop((namespace, name), None)
            return None
        snapshot = self.cache.snapshot((namespace, name))
        pods = [
            p
            for p in snapshot.of_kind("v1", "Pod")
            if (_meta(p).get("labels") or {}).get(CLUSTER_LABEL) == name
        ]
        decision = decide_finalizer(
            body,
            statefulset_exists=snapshot.find("apps/v1", "StatefulSet", name) is not None,
            pods_left=len(pods),
            now=self.clock(),
        )
        if decision.action != "none":
            return await self._finalizer_step(key, body, decision.action, decision.why)
        try:
            config = backup_config(body)
        except ValueError as exc:
            log.info("cluster %s/%s: spec.backup invalid, skipping backups: %s", namespace, name, exc)
            return None
        if config is None:
            await self._write_cluster_status(body, {t: None for t in BACKUP_CONDITION_TYPES}, None)
            self.metrics.forget_archive((namespace, name))
            return None
        store = store_of(body, config)
        primary = primary_pod(pods, name)
        ident = (namespace, name)
        clock = time.monotonic()
        cached = self._probes.get(ident)
        due_retention = config.retention is not None and (
            self.clock().timestamp() - self._retention_at.get(ident, 0.0) >= self.retention_seconds
        )
        if (
            cached is not None
            and cached[0] == primary
            and clock - cached[3] < self.min_probe_seconds
            and not due_retention
        ):
            # Woken again soon (a status write, a pod event): the conditions are recomputed from the
            # last probe; the pod is not asked again.
            _, stats, store_failure, _ = cached
        else:
            stats, store_failure = await self._probe(namespace, name, primary, store, config, due_retention)
            self._probes[ident] = (primary, stats, store_failure, clock)
        archiving = archiving_condition(stats, store_failure=store_failure, primary=primary)
        ours: dict[str, tuple[str, str, str] | None] = {
            "ContinuousArchiving": archiving.as_tuple(),
            "BackupStoreCleanup": None,
        }
        mine = [
            b
            for (ns, _), b in self.backups.items()
            if ns == namespace and (b.get("spec") or {}).get("cluster") == name
        ]
        last = last_backup_condition(mine)
        if last is not None:
            ours["LastBackupSucceeded"] = last
        summary: dict[str, Any] = {}
        if stats is not None:
            summary["archiving"] = archiving_summary(stats, primary)
        elif ((body.get("status") or {}).get(BACKUP_STATUS_KEY) or {}).get("archiving"):
            summary["archiving"] = body["status"][BACKUP_STATUS_KEY]["archiving"]
        done = [b for b in mine if (b.get("status") or {}).get("phase") == "Completed"]
        if done:
            newest = max(done, key=lambda b: str((b.get("status") or {}).get("stoppedAt") or ""))
            summary["lastSuccessfulBackup"] = _name(newest)
            summary["lastSuccessfulBackupTime"] = (newest.get("status") or {}).get("stoppedAt")
        await self._write_cluster_status(body, ours, summary or None)
        if archiving.status == "False" and archiving.reason != "NothingArchivedYet":
            await self._event_once(
                key, body, "Warning", archiving.reason, f"ContinuousArchiving: {archiving.message}"
            )
        elif archiving.status == "True" and self._events_sent.get((key, "Warning")):
            self._events_sent.pop((key, "Warning"), None)
            await self._event(body, "Normal", "ArchivingResumed", archiving.message)
        return self.archive_check_seconds

    async def _probe(
        self,
        namespace: str,
        name: str,
        primary: str | None,
        store: ObjectStore,
        config: BackupConfiguration,
        due_retention: bool,
    ) -> tuple[ArchiverStats | None, Failure | None]:
        """pg_stat_archiver on the primary; the store itself (backup-list) when archiving fails or
        retention is due; retention when due."""
        if primary is None:
            return None, None
        stats: ArchiverStats | None = None
        try:
            stats = await self._archiver_stats(namespace, primary)
        except (ExecError, ValueError) as exc:
            log.info("cluster %s/%s: pg_stat_archiver unreadable on %s: %s", namespace, name, primary, exc)
        if stats is not None and stats.last_archived_time is not None:
            self.metrics.set_last_archived((namespace, name), stats.last_archived_time.timestamp())
        store_failure: Failure | None = None
        if due_retention:  # attempted now; a failing store is not listed on every wake-up for it
            self._retention_at[(namespace, name)] = self.clock().timestamp()
        # The store is asked too when nothing was archived yet: a broken store is reported before
        # the first segment is even complete.
        if stats is None or stats.failing or stats.archived_count == 0 or due_retention:
            listing, store_failure = await self._list_backups(namespace, primary, store)
            if listing is not None and due_retention and config.retention is not None:
                body = self.cache.cluster((namespace, name)) or {
                    "metadata": {"name": name, "namespace": namespace}
                }
                await self._enforce_retention(body, namespace, primary, store, config, listing)
        return stats, store_failure

    async def _archiver_stats(self, namespace: str, pod: str) -> ArchiverStats:
        result = await self.exec.run(namespace, pod, [*PSQL, "-F", "|", "-c", ARCHIVER_QUERY], seconds=30)
        if result.exit_status != 0:
            raise ExecError(f"psql exited {result.exit_status}: {result.stderr.strip()[-300:]}")
        return parse_archiver_line(result.stdout.strip().splitlines()[-1])

    async def _list_backups(
        self, namespace: str, pod: str, store: ObjectStore
    ) -> tuple[dict[str, Any] | None, Failure | None]:
        """barman-cloud-backup-list in the pod: the catalog for retention, and a probe of the store (its
        failure, classified, says why archiving fails)."""
        try:
            result = await self.exec.run(namespace, pod, backup_list_argv(store), seconds=120)
        except ExecError as exc:
            log.info("backup list in %s/%s failed: %s", namespace, pod, exc)
            return None, None
        if result.exit_status != 0:
            return None, classify(result.exit_status, result.output)
        try:
            return json.loads(result.stdout), None
        except ValueError:
            return None, classify(1, result.output)

    async def _enforce_retention(
        self,
        body: Mapping[str, Any],
        namespace: str,
        pod: str,
        store: ObjectStore,
        config: BackupConfiguration,
        listing: Mapping[str, Any],
    ) -> None:
        assert config.retention is not None
        name = _name(body)
        catalog = records(listing)
        doomed = obsolete_backups(catalog, config.retention.policy(), self.clock())
        deleted: set[str] = set()
        failed = False
        for backup_id in doomed:
            result = await self.exec.run(namespace, pod, delete_backup_argv(store, backup_id), seconds=600)
            if result.exit_status != 0:
                failure = classify(result.exit_status, result.output)
                await self._event(
                    body, "Warning", "RetentionFailed", f"deleting backup {backup_id}: {failure.message}"
                )
                failed = True
                break
            deleted.add(backup_id)
            log.info("retention: deleted backup %s of %s/%s", backup_id, namespace, name)
            await self._event(body, "Normal", "BackupDeleted", f"retention deleted base backup {backup_id}")
        # The Backup objects of what is gone go too, so a Backup object always names a restorable base
        # backup (also those of a pass that stopped between the store and the object).
        await self._retire_backup_objects(
            body, namespace, store, [r for r in catalog if r.backup_id not in deleted]
        )
        if not failed:
            self._retention_at[(namespace, name)] = self.clock().timestamp()

    async def _retire_backup_objects(
        self, cluster: Mapping[str, Any], namespace: str, store: ObjectStore, remaining: list[BackupRecord]
    ) -> None:
        name = _name(cluster)
        objects = [b for (ns, _), b in self.backups.items() if ns == namespace]
        retired = retired_backup_objects(
            objects,
            remaining,
            cluster=name,
            server_name=store.server_name,
            destination_path=store.destination_url,
        )
        for backup_name in retired:
            backup_id = (self.backups.get((namespace, backup_name), {}).get("status") or {}).get("backupID")
            try:
                await self.api.delete(f"{GROUP}/{VERSION}", BACKUP_KIND, backup_name, namespace)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            self.backups.pop((namespace, backup_name), None)
            log.info("retention: deleted Backup %s/%s (base backup %s)", namespace, backup_name, backup_id)
            await self._event(
                cluster,
                "Normal",
                "BackupRecordDeleted",
                f"deleted Backup {backup_name}: retention removed its base backup {backup_id} from the store",
            )

    async def _write_cluster_status(
        self,
        body: Mapping[str, Any],
        ours: dict[str, tuple[str, str, str] | None],
        summary: dict[str, Any] | None,
    ) -> None:
        previous = body.get("status") or {}
        meta = _meta(body)
        conditions = merged_conditions(
            previous, ours, generation=int(meta.get("generation") or 0), stamp=rfc3339(self.clock())
        )
        patch_status: dict[str, Any] = {}
        if _canonical(conditions) != _canonical(previous.get("conditions") or []):
            patch_status["conditions"] = conditions
        if _canonical(summary) != _canonical(previous.get(BACKUP_STATUS_KEY)):
            # A merge patch merges maps: null first the keys that went away.
            patch_status[BACKUP_STATUS_KEY] = summary
        if not patch_status:
            return
        # The resourceVersion makes the write conditional: the cluster's own reconcile may have just
        # written conditions this copy does not show; then this pass is retried on the fresh object.
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": patch_status}
        try:
            await self.api.merge_patch(
                PostgresClusterResource,
                str(meta["name"]),
                str(meta["namespace"]),
                patch,
                subresource_status=True,
            )
        except ApiError as exc:
            if is_not_found(exc):
                return
            if is_conflict(exc):
                raise ApiErrorRetry("the cluster changed while its backup status was written") from None
            raise

    async def _finalizer_step(self, key: Key, body: Mapping[str, Any], action: str, why: str) -> float | None:
        namespace, name = key[1], key[2]
        meta = _meta(body)
        if action == "add":
            await self._set_finalizers(body, finalizers_with(meta))
            return 1.0
        if action in ("remove", "release-by-hand"):
            await self._set_finalizers(body, finalizers_without(meta))
            if action == "release-by-hand":
                await self._event(
                    body, "Warning", "BackupStoreReleased", f"finalizer released by hand: {why}"
                )
            return None if meta.get("deletionTimestamp") else 1.0
        if action == "stop-pods":
            log.info(
                "cluster %s/%s deleted with onDelete=delete: stopping its instances first", namespace, name
            )
            try:
                await self.api.delete("apps/v1", "StatefulSet", name, namespace)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            await self._write_cleanup_condition(body, ("False", "StoppingInstances", why))
            return 2.0
        if action == "wait-pods":
            await self._write_cleanup_condition(body, ("False", "StoppingInstances", why))
            return 3.0
        # delete-store
        config = backup_config(body)
        assert config is not None
        store = store_of(body, config)
        try:
            access = await self._store_access(namespace, config, store)
            deleted = await delete_prefix(access)
        except StoreError as exc:
            text = str(exc)
            if text.startswith("NoSuchBucket"):
                deleted = 0
                log.info(
                    "cluster %s/%s: bucket %s does not exist; nothing to delete",
                    namespace,
                    name,
                    store.bucket,
                )
            else:
                failure = classify(1, text, secrets=())
                failures = self.failures.get(key, 0) + 1
                self.failures[key] = failures
                delay = self.backoff.delay(failures)
                message = (
                    f"cannot delete the cluster's objects under {store.destination_url}/{store.prefix}: "
                    f"{failure.message}; retrying in {delay:.0f} s. To give up and keep them, annotate the "
                    "cluster with db.example.com/release-backup-store=true"
                )
                await self._write_cleanup_condition(body, ("False", failure.reason, message))
                await self._event_once(key, body, "Warning", f"BackupStoreCleanup{failure.reason}", message)
                return delay
        self.failures.pop(key, None)
        where = f"{store.destination_url}/{store.prefix}"
        await self._event(body, "Normal", "BackupStoreDeleted", f"deleted {deleted} object(s) under {where}")
        await self._set_finalizers(body, finalizers_without(meta))
        return None

    async def _store_access(
        self, namespace: str, config: BackupConfiguration, store: ObjectStore
    ) -> StoreAccess:
        creds = config.s3.credentials
        try:
            secret = await self.api.get(Secret, creds.secret_name, namespace)
        except ApiError as exc:
            raise StoreError(f"credentials Secret {creds.secret_name}: {exc.status.message}") from None
        data = secret.data or {}

        def value(key: str | None) -> str | None:
            if key is None or key not in data:
                return None
            return base64.b64decode(data[key]).decode()

        key_id, secret_key = value(creds.access_key_id_key), value(creds.secret_access_key_key)
        if not key_id or not secret_key:
            raise StoreError(
                f"credentials Secret {creds.secret_name} lacks {creds.access_key_id_key} or "
                f"{creds.secret_access_key_key}"
            )
        return StoreAccess(
            bucket=store.bucket,
            prefix=store.prefix,
            endpoint_url=store.endpoint_url,
            region=store.region,
            access_key_id=key_id,
            secret_access_key=secret_key,
            session_token=value(creds.session_token_key),
        )

    async def _set_finalizers(self, body: Mapping[str, Any], finalizers: list[str]) -> None:
        meta = _meta(body)
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}}
        try:
            await self.api.merge_patch(
                PostgresClusterResource, str(meta["name"]), str(meta["namespace"]), patch
            )
        except ApiError as exc:
            if is_not_found(exc):
                return
            if is_conflict(exc):
                raise ApiErrorRetry("the cluster changed while its finalizers were written") from None
            raise

    async def _write_cleanup_condition(self, body: Mapping[str, Any], value: tuple[str, str, str]) -> None:
        await self._write_cluster_status(
            body, {"BackupStoreCleanup": value}, (body.get("status") or {}).get(BACKUP_STATUS_KEY)
        )


class ApiErrorRetry(Exception):
    """A conditional write lost a race; the pass is retried shortly on the fresh object."""
