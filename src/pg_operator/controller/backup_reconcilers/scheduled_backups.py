"""The ScheduledBackup reconciler: creates a Backup when the schedule says so and keeps the status
(last and next schedule time, last Backup) current. Keyed (namespace, name)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.backup.scheduling import cluster_hibernating, schedule_pass
from pg_operator.controller.backup_kinds import ScheduledBackupResource
from pg_operator.controller.backup_reconcilers.shared import Notices, again, wrote
from pg_operator.controller.cache import Cache
from pg_operator.controller.kube_api import Api, is_conflict
from pg_operator.controller.loop import Result
from pg_operator.controller.writes import canonical

log = logging.getLogger(__name__)


class ScheduledBackupReconciler:
    def __init__(self, api: Api, cache: Cache, notices: Notices, *, clock: Callable[[], dt.datetime]) -> None:
        self.api = api
        self.cache = cache
        self.notices = notices
        self.clock = clock

    async def reconcile(self, key: tuple[str, str]) -> Result:
        namespace, name = key
        body = self.cache.scheduled_backup(key)
        if body is None:
            return Result(gone=True)
        if objects.deleting(body):
            return again(None)
        cluster = self.cache.cluster((namespace, str(objects.spec(body).get("cluster") or "")))
        sp = schedule_pass(body, self.clock(), paused=cluster_hibernating(cluster))
        if sp.backup is not None:
            created = sp.backup["metadata"]["name"]
            try:
                await self.api.create_dict(sp.backup)
                log.info("ScheduledBackup %s/%s created Backup %s", namespace, name, created)
                await self.notices.post(body, "Normal", "BackupCreated", f"created Backup {created}")
            except ApiError as exc:
                if not is_conflict(exc):
                    raise
        if canonical(dict(objects.status(body))) != canonical(sp.status):
            await self.api.merge_patch(
                ScheduledBackupResource, name, namespace, {"status": sp.status}, subresource_status=True
            )
            wrote(self.cache, {**body, "status": sp.status})
        return again(sp.requeue)
