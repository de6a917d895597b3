"""The Backup reconciler: takes one base backup, in a detached job in one of the cluster's pods, and
records what barman says of it in the Backup's status. A backup starts only in a store prefix the
cluster owns (backup.store_ownership); otherwise it fails, naming the prefix and the owner found.

Keyed (namespace, cluster, name): the cache holds Backups by their cluster (spec.cluster cannot change).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import BackupConfiguration
from pg_operator.api.constants import PG_PORT, SUPERUSER
from pg_operator.backup import generations, jobs
from pg_operator.backup.barman import ObjectStore, backup_show_argv, base_backup_argv
from pg_operator.backup.catalog import backup_status
from pg_operator.backup.failures import classify
from pg_operator.backup.lifecycle import after_poll, before_start
from pg_operator.backup.placement import choose_instance, primary_pod
from pg_operator.backup.scheduling import rfc3339
from pg_operator.controller.backup_kinds import BackupResource
from pg_operator.controller.backup_reconcilers.ownership import StoreOwnership
from pg_operator.controller.backup_reconcilers.shared import (
    PSQL,
    SOCKET_DIR,
    Notices,
    again,
    backup_config,
    store_of,
    wrote,
)
from pg_operator.controller.cache import Cache
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.kube_api import Api
from pg_operator.controller.loop import Result
from pg_operator.controller.pod_exec import ExecError, PodExec
from pg_operator.controller.store_calls import BUSY_RETRY_SECONDS
from pg_operator.controller.store_client import StoreBusy, StoreError
from pg_operator.controller.writes import canonical, status_patch

log = logging.getLogger(__name__)

BackupKey = tuple[str, str, str]  # (namespace, cluster, name)
JOB_POLL_SECONDS = 10.0  # a started job is looked at again after this


def backup_key(body: Mapping[str, Any]) -> BackupKey:
    return (objects.namespace(body), str(objects.spec(body).get("cluster") or ""), objects.name(body))


class BackupReconciler:
    """`cluster_news(cluster_key)`: a Backup of that cluster ended (or failed); `backup_completed`: one
    completed, so retention runs on the cluster's next reconcile."""

    def __init__(
        self,
        api: Api,
        cache: Cache,
        pod_exec: PodExec,
        notices: Notices,
        ownership: StoreOwnership,
        *,
        cluster_news: Callable[[ClusterKey], None],
        backup_completed: Callable[[ClusterKey], None],
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.api = api
        self.cache = cache
        self.exec = pod_exec
        self.notices = notices
        self.ownership = ownership
        self.cluster_news = cluster_news
        self.backup_completed = backup_completed
        self.clock = clock

    def _body(self, key: BackupKey) -> dict[str, Any] | None:
        namespace, cluster, name = key
        found = [b for b in self.cache.backups((namespace, cluster)) if objects.name(b) == name]
        # Two only while a deleted Backup's DELETED trails its successor's ADDED: the newer one.
        return max(found, key=lambda b: int(objects.resource_version(b) or "0")) if found else None

    async def _write_status(self, body: dict[str, Any], fields: Mapping[str, Any]) -> None:
        current = dict(objects.status(body))
        wanted = {**current, **fields}
        wanted = {k: v for k, v in wanted.items() if v is not None}
        if canonical(wanted) == canonical(current):
            return
        patch = status_patch(current, wanted)
        await self.api.merge_patch(
            BackupResource, objects.name(body), objects.namespace(body), patch, subresource_status=True
        )
        body["status"] = wanted
        wrote(self.cache, body)

    async def reconcile(self, key: BackupKey) -> Result:
        namespace, cluster_name, name = key
        body = self._body(key)
        if body is None:
            return Result(gone=True)
        if objects.deleting(body):
            return again(None)
        status = dict(objects.status(body))
        if status.get("phase") in ("Completed", "Failed"):
            return again(None)
        now = rfc3339(self.clock())
        cluster = self.cache.cluster((namespace, cluster_name))
        pods = self.cache.snapshot((namespace, cluster_name)).of_kind("v1", "Pod")
        on_primary = generations.taken_on_primary(body) or generations.just_upgraded(cluster, self.clock())
        placement = choose_instance(pods, cluster_name, prefer_replica=not on_primary)
        step = before_start(status, cluster=cluster, placement=placement, now_stamp=now)
        if step.kind == "done":
            return again(None)
        if step.kind in ("fail", "wait"):
            await self._write_status(body, step.status)
            if step.kind == "fail":
                await self._failed(key, body, cluster, step.reason, step.message)
            return again(step.requeue)
        config = backup_config(cluster) if cluster is not None else None
        if cluster is None or config is None:
            # Running, and the cluster or its spec.backup went away meanwhile.
            reason = "ClusterNotFound" if cluster is None else "BackupNotConfigured"
            message = "the cluster or its spec.backup went away while the backup ran"
            await self._write_status(
                body, {"phase": "Failed", "error": f"{reason}: {message}", "stoppedAt": now}
            )
            await self._failed(key, body, cluster, reason, message)
            return again(None)
        store = store_of(cluster, config)
        if status.get("serverName") and status["serverName"] != store.server_name:
            # Started before the cluster's backups moved to a new generation (backup.generations).
            store = store.with_server(str(status["serverName"]))
        if step.kind == "start":
            assert step.pod
            try:
                refused = await self._not_ours(cluster, config, store)
            except StoreBusy:  # another store call of the namespace is in flight
                return again(BUSY_RETRY_SECONDS)
            if refused is not None:
                reason, message = refused
                await self._write_status(body, {"phase": "Failed", "error": f"{reason}: {message}",
                                                "stoppedAt": now})  # fmt: skip
                await self._failed(key, body, cluster, reason, message)
                return again(None)
            await self._write_status(
                body,
                {**step.status, "serverName": store.server_name, "destinationPath": store.destination_url},
            )
            await self._start_job(namespace, step.pod, name, store,
                                  writable_first=generations.taken_on_primary(body))  # fmt: skip
            await self.notices.post(body, "Normal", "Started", step.message)
            return again(JOB_POLL_SECONDS)
        return await self._running(key, body, cluster, pods, store, now)

    async def _not_ours(
        self, cluster: Mapping[str, Any], config: BackupConfiguration, store: ObjectStore
    ) -> tuple[str, str] | None:
        """(reason, message) when the base backup must not be written to the store: the prefix is not
        the cluster's, or the store cannot say (classified like barman's own failure would be). Asked
        of the store afresh: a kept verdict is not trusted with a base backup's writes."""
        try:
            verdict = await self.ownership.check(cluster, config, store, fresh=True)
        except StoreBusy:
            raise  # not a failure of the backup: its reconcile comes back shortly
        except StoreError as exc:
            failure = classify(1, str(exc))
            return failure.reason, failure.message
        return None if verdict.ours else (verdict.reason, verdict.message)

    async def _running(
        self,
        key: BackupKey,
        body: dict[str, Any],
        cluster: Mapping[str, Any],
        pods: list[dict[str, Any]],
        store: ObjectStore,
        now: str,
    ) -> Result:
        """Watch the job in its pod; once it exited 0, record what barman recorded."""
        namespace, cluster_name, name = key
        pod = str(objects.status(body).get("instance") or "")
        if not any(objects.name(p) == pod for p in pods):
            message = f"the instance {pod or '(none)'} that ran the backup is gone"
            await self._write_status(
                body, {"phase": "Failed", "error": f"BackupInterrupted: {message}", "stoppedAt": now}
            )
            await self._failed(key, body, cluster, "BackupInterrupted", message)
            return again(None)
        result = await self.exec.sh(namespace, pod, jobs.poll_script(name), seconds=30)
        if result.exit_status != 0:
            raise ExecError(
                f"polling the backup job in {pod} exited {result.exit_status}: {result.stderr[-300:]}"
            )
        polled = after_poll(jobs.parse_poll(result.stdout), now_stamp=now)
        if polled.kind == "wait":
            return again(polled.requeue)
        if polled.kind == "start":
            await self._start_job(namespace, pod, name, store,
                                  writable_first=generations.taken_on_primary(body))  # fmt: skip
            return again(JOB_POLL_SECONDS)
        if polled.kind == "fail":
            await self._write_status(body, polled.status)
            await self._cleanup_job(namespace, pod, name)
            await self._failed(key, body, cluster, polled.reason, polled.message)
            return again(None)
        shown = await self.exec.run(namespace, pod, backup_show_argv(store, name), seconds=120)
        if shown.exit_status != 0:
            failure = classify(shown.exit_status, shown.output)
            raise ExecError(f"barman-cloud-backup-show: {failure.message}")
        fields = backup_status(json.loads(shown.stdout))
        await self._write_status(body, {**fields, "error": fields.get("error")})
        await self._cleanup_job(namespace, pod, name)
        if fields.get("phase") == "Completed":
            await self._after_standby_backup(namespace, cluster_name, pod, pods)
            size = fields.get("size")
            message = f"base backup {fields.get('backupID')} completed on {pod} ({size} bytes)"
            await self.notices.post(body, "Normal", "Completed", message)
            self.backup_completed((namespace, cluster_name))
        elif fields.get("phase") == "Failed":
            await self._failed(key, body, cluster, "BackupFailed", str(fields.get("error")))
        self.cluster_news((namespace, cluster_name))
        return again(None)

    async def _failed(
        self, key: BackupKey, body: Mapping[str, Any], cluster: Mapping[str, Any] | None, reason: str,
        message: str,
    ) -> None:  # fmt: skip
        name = key[2]
        await self.notices.post(body, "Warning", reason, f"Backup {name} failed: {message}")
        if cluster is not None:
            await self.notices.post(
                cluster, "Warning", "BackupFailed", f"Backup {name} failed: {reason}: {message}"
            )
            self.cluster_news((key[0], objects.name(cluster)))

    async def _start_job(
        self, namespace: str, pod: str, name: str, store: ObjectStore, *, writable_first: bool = False
    ) -> None:
        argv = base_backup_argv(store, name=name, host=SOCKET_DIR, port=PG_PORT, user=SUPERUSER)
        if writable_first:
            argv = jobs.once_writable(argv, PSQL)
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
