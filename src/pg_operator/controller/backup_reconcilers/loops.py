"""The three backup reconcilers, each on a ReconcileLoop of its own, and the wake-ups that feed them.

A loop per kind rather than one loop over tagged keys: a Backup poll (an exec of up to two minutes)
or a retention run (deletes of up to ten) then never delays a ScheduledBackup's creation or another
kind's pass, and none of them shares workers or a queue with the clusters' own reconcile. No loop
resyncs: each reconcile says when its key is due again (a job to poll, the next schedule, the next archive
check), and watch events wake the rest.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from pg_operator import objects
from pg_operator.backup.store_cleanup import FINALIZER
from pg_operator.backup.store_policy import StoreLimits
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.backup_reconcilers.backups import BackupKey, BackupReconciler, backup_key
from pg_operator.controller.backup_reconcilers.cluster_backups import ClusterBackupReconciler
from pg_operator.controller.backup_reconcilers.ownership import StoreOwnership
from pg_operator.controller.backup_reconcilers.scheduled_backups import ScheduledBackupReconciler
from pg_operator.controller.backup_reconcilers.shared import Notices
from pg_operator.controller.cache import Cache
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.keys import ClusterKey, cluster_key_of_cluster
from pg_operator.controller.kube_api import Api
from pg_operator.controller.loop import ReconcileLoop
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.store_limits import configure as configure_store_limits
from pg_operator.specs.backup_status import BACKUP_CONDITION_TYPES

# Slower than the clusters' retries: most failures here are a store or a pod that needs time.
BACKOFF = Backoff(base=2.0, cap=300.0)
CLUSTER_NEWS_DELAY = 1.0  # a Backup changed or ended: the cluster's conditions follow after this
CLUSTER_CHANGE_DELAY = 0.5


def _wants_backup_pass(cluster: Mapping[str, Any]) -> bool:
    """spec.backup, our finalizer or a backup condition to clear: anything else costs nothing."""
    return bool(
        objects.spec(cluster).get("backup")
        or FINALIZER in (objects.meta(cluster).get("finalizers") or ())
        or any(objects.condition(objects.status(cluster), t) for t in BACKUP_CONDITION_TYPES)
    )


class BackupLoops:
    def __init__(
        self,
        api: Api,
        cache: Cache,
        metrics: Metrics,
        pod_exec: PodExec,
        identity: str,
        *,
        workers: tuple[int, int, int] = (4, 2, 2),  # clusters, Backups, ScheduledBackups
        retention_seconds: float = 600.0,
        store_limits: StoreLimits | None = None,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.exec = pod_exec
        # One policy for every store call of the process (the sub-reconcilers' too:
        # reconcilers/major_upgrade_backups.py).
        configure_store_limits(store_limits or StoreLimits())
        recorder = EventRecorder(api, identity)
        ownership = StoreOwnership(api, cache, clock)  # one view of who owns which prefix, for both
        cluster_side = ClusterBackupReconciler(
            api, cache, metrics, pod_exec, Notices(recorder), ownership, backoff=BACKOFF, clock=clock,
            retention_seconds=retention_seconds,
        )  # fmt: skip
        self.clusters: ReconcileLoop[ClusterKey] = ReconcileLoop(
            cluster_side, name="cluster backup pass", workers=workers[0], resync_seconds=None, backoff=BACKOFF
        )
        backups = BackupReconciler(
            api,
            cache,
            pod_exec,
            Notices(recorder),
            ownership,
            cluster_news=lambda key: self.clusters.wake_after(key, CLUSTER_NEWS_DELAY),
            backup_completed=cluster_side.retention_due,
            clock=clock,
        )
        self.backups: ReconcileLoop[BackupKey] = ReconcileLoop(
            backups, name="Backup pass", workers=workers[1], resync_seconds=None, backoff=BACKOFF
        )
        scheduled = ScheduledBackupReconciler(api, cache, Notices(recorder), clock=clock)
        self.scheduled: ReconcileLoop[tuple[str, str]] = ReconcileLoop(
            scheduled, name="ScheduledBackup pass", workers=workers[2], resync_seconds=None, backoff=BACKOFF
        )

    # Wake-ups (controller/wakeups.py calls these once the cache has the event's object).

    def on_backup(self, body: Mapping[str, Any], event_type: str | None) -> None:
        key = backup_key(body)
        if event_type != "DELETED":
            self.backups.wake(key)
        if key[1]:
            self.clusters.wake_after((key[0], key[1]), CLUSTER_NEWS_DELAY)

    def on_scheduled_backup(self, body: Mapping[str, Any], event_type: str | None) -> None:
        if event_type != "DELETED":
            self.scheduled.wake(cluster_key_of_cluster(body))

    def on_cluster(self, body: Mapping[str, Any]) -> None:
        if _wants_backup_pass(body):
            self.clusters.wake_after(cluster_key_of_cluster(body), CLUSTER_CHANGE_DELAY)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for loop in (self.clusters, self.backups, self.scheduled):
                tg.create_task(loop.run())

    async def close(self) -> None:
        for loop in (self.clusters, self.backups, self.scheduled):
            loop.close()
        await self.exec.close()
