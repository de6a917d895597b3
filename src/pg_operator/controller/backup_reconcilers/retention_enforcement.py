"""Retention, run from a cluster's backup pass: delete the base backups the policy no longer keeps (in
the primary's pod, with barman), then the Backup objects of base backups the store no longer has."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.backup import BACKUP_KIND, BackupConfiguration
from pg_operator.api.constants import GROUP, VERSION
from pg_operator.backup.barman import ObjectStore, delete_backup_argv
from pg_operator.backup.catalog import records
from pg_operator.backup.failures import classify
from pg_operator.backup.from_spec import retention_policy
from pg_operator.backup.retention import BackupRecord, obsolete_backups, retired_backup_objects
from pg_operator.controller.backup_reconcilers.shared import Notices, wrote
from pg_operator.controller.cache import Cache
from pg_operator.controller.kube_api import Api, is_not_found
from pg_operator.controller.pod_exec import PodExec

log = logging.getLogger(__name__)


class Retention:
    def __init__(
        self, api: Api, cache: Cache, pod_exec: PodExec, notices: Notices, clock: Callable[[], dt.datetime]
    ) -> None:
        self.api = api
        self.cache = cache
        self.exec = pod_exec
        self.notices = notices
        self.clock = clock

    async def enforce(
        self,
        cluster: Mapping[str, Any],
        pod: str,
        store: ObjectStore,
        config: BackupConfiguration,
        listing: Mapping[str, Any],
    ) -> bool:
        """True when every obsolete base backup could be deleted."""
        assert config.retention is not None
        namespace, name = objects.namespace(cluster), objects.name(cluster)
        catalog = records(listing)
        doomed = obsolete_backups(catalog, retention_policy(config.retention), self.clock())
        deleted: set[str] = set()
        failed = False
        for backup_id in doomed:
            result = await self.exec.run(namespace, pod, delete_backup_argv(store, backup_id), seconds=600)
            if result.exit_status != 0:
                failure = classify(result.exit_status, result.output)
                await self.notices.post(
                    cluster, "Warning", "RetentionFailed", f"deleting backup {backup_id}: {failure.message}"
                )
                failed = True
                break
            deleted.add(backup_id)
            log.info("retention: deleted backup %s of %s/%s", backup_id, namespace, name)
            await self.notices.post(
                cluster, "Normal", "BackupDeleted", f"retention deleted base backup {backup_id}"
            )
        # The Backup objects of what is gone go too, so a Backup object always names a restorable base
        # backup (also those of a reconcile that stopped between the store and the object).
        await self._retire_backup_objects(cluster, store, [r for r in catalog if r.backup_id not in deleted])
        return not failed

    async def _retire_backup_objects(
        self, cluster: Mapping[str, Any], store: ObjectStore, remaining: list[BackupRecord]
    ) -> None:
        namespace, name = objects.namespace(cluster), objects.name(cluster)
        mine = {objects.name(b): b for b in self.cache.backups((namespace, name))}
        retired = retired_backup_objects(
            list(mine.values()),
            remaining,
            cluster=name,
            server_name=store.server_name,
            destination_path=store.destination_url,
        )
        for backup_name in retired:
            backup_id = objects.status(mine[backup_name]).get("backupID")
            try:
                await self.api.delete(f"{GROUP}/{VERSION}", BACKUP_KIND, backup_name, namespace)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            wrote(self.cache, mine[backup_name], "DELETED")
            log.info("retention: deleted Backup %s/%s (base backup %s)", namespace, backup_name, backup_id)
            await self.notices.post(
                cluster,
                "Normal",
                "BackupRecordDeleted",
                f"deleted Backup {backup_name}: retention removed its base backup {backup_id} from the store",
            )
