"""The backup reconcilers' wiring with plain dicts: Backups and ScheduledBackups in the watch cache, which
events wake which loop, Events once per reason, and the passes that must cost no request at all."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from harness import objects as harness_objects
from pg_operator.api.constants import API_VERSION, CLUSTER_LABEL
from pg_operator.backup.store_cleanup import FINALIZER
from pg_operator.controller.backup_reconcilers.backups import BackupReconciler
from pg_operator.controller.backup_reconcilers.cluster_backups import ClusterBackupReconciler
from pg_operator.controller.backup_reconcilers.loops import BACKOFF, BackupLoops
from pg_operator.controller.backup_reconcilers.ownership import StoreOwnership
from pg_operator.controller.backup_reconcilers.scheduled_backups import ScheduledBackupReconciler
from pg_operator.controller.backup_reconcilers.shared import Notices
from pg_operator.controller.cache import Cache, watched_kinds
from pg_operator.controller.cache_sync import SyncGate
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.kube_api import Api
from pg_operator.controller.loop import ReconcileLoop, Result
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.wakeups import Wakeups, feeds
from pg_operator.specs import MANAGED_KINDS

NS = "shop"
T0 = dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC)
# Nothing in these tests may make a request: a None in the API's place fails any that would.
NO_API = cast(Api, None)
NO_EXEC = cast(PodExec, None)


def backup(name: str, cluster: str, *, uid: str | None = None, phase: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "Backup",
        "metadata": {"name": name, "namespace": NS, "uid": uid or f"uid-{name}", "resourceVersion": "1"},
        "spec": {"cluster": cluster},
    }
    if phase:
        body["status"] = {"phase": phase, "stoppedAt": "2026-12-01T07:00:00Z", "backupID": "20261201T070000"}
    return body


def scheduled(name: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T08:00:00Z"
    return {"apiVersion": API_VERSION, "kind": "ScheduledBackup", "metadata": meta,
            "spec": {"cluster": "db", "schedule": "0 * * * *"}}  # fmt: skip


def cluster(name: str = "db", **extra: Any) -> dict[str, Any]:
    meta = {"uid": f"uid-{name}", "resourceVersion": "1", "generation": 1, **extra.pop("meta", {})}
    body = harness_objects.cluster(name, NS, replicas=1, metadata=meta, **extra.pop("spec", {}))
    body["status"] = extra.pop("status", {})
    return body


def cache() -> Cache:
    return Cache(watched_kinds(MANAGED_KINDS))


def test_backups_are_cached_by_their_cluster_and_scheduled_backups_by_name() -> None:
    c = cache()
    for body in (backup("b-1", "db"), backup("b-2", "db"), backup("b-3", "other"), scheduled("nightly")):
        c.observe(body, None)
    assert sorted(b["metadata"]["name"] for b in c.backups((NS, "db"))) == ["b-1", "b-2"]
    assert [b["metadata"]["name"] for b in c.backups((NS, "other"))] == ["b-3"]
    assert (c.scheduled_backup((NS, "nightly")) or {})["spec"]["schedule"] == "0 * * * *"
    c.observe(backup("b-1", "db"), "DELETED")
    c.observe(scheduled("nightly"), "DELETED")
    assert [b["metadata"]["name"] for b in c.backups((NS, "db"))] == ["b-2"]
    assert c.scheduled_backup((NS, "nightly")) is None
    assert c.snapshot((NS, "db")).children.get((API_VERSION, "Backup")) is None  # not a child kind


class Idle:
    async def reconcile(self, key: tuple[str, str]) -> Result:
        return Result()


async def test_the_sync_gate_does_not_wait_for_backups() -> None:
    # A missing backup CRD must not keep the operator from syncing: its backup kinds are watched, not awaited.
    kinds = watched_kinds(MANAGED_KINDS)
    gate = SyncGate()
    c = Cache(kinds, gate)
    every = feeds(Wakeups(ReconcileLoop(Idle()), c, loops()), kinds)
    gate.expect((f.kind.key, None) for f in every if f.awaited)
    by_kind = {f.kind.kind: f for f in every}
    assert not by_kind["Backup"].awaited and not by_kind["ScheduledBackup"].awaited
    by_kind["Backup"].deliver(backup("b-1", "db"), None)
    for feed in every:
        if feed.awaited:
            gate.listed(feed.kind.key)
    assert gate.open and len(c.backups((NS, "db"))) == 1


def loops() -> BackupLoops:
    return BackupLoops(NO_API, cache(), Metrics(), NO_EXEC, "test", clock=lambda: T0)


async def test_a_backup_event_wakes_its_backup_now_and_its_cluster_a_second_later() -> None:
    bl = loops()
    bl.on_backup(backup("b-1", "db"), "ADDED")
    assert bl.backups.queue.waiting()["new"] == 1
    assert 0.9 < (bl.clusters.queue.pending_delay((NS, "db")) or 0) <= 1.0
    deleted = loops()
    deleted.on_backup(backup("b-1", "db"), "DELETED")
    assert deleted.backups.queue.waiting()["new"] == 0  # nothing left to do for it
    assert deleted.clusters.queue.pending_delay((NS, "db")) is not None  # its conditions may change


async def test_only_clusters_with_backup_business_get_a_backup_pass() -> None:
    bl = loops()
    bl.on_cluster(cluster("plain"))
    bl.on_cluster(cluster("archived", spec={"backup": {"s3": {}}}))
    bl.on_cluster(cluster("finalized", meta={"finalizers": [FINALIZER]}))
    stale = {"conditions": [{"type": "ContinuousArchiving", "status": "False"}]}
    bl.on_cluster(cluster("stale", status=stale))
    woken = [
        n for n in ("plain", "archived", "finalized", "stale") if bl.clusters.queue.pending_delay((NS, n))
    ]
    assert woken == ["archived", "finalized", "stale"]


async def test_a_scheduled_backup_event_wakes_it_unless_deleted() -> None:
    bl = loops()
    bl.on_scheduled_backup(scheduled("nightly"), "MODIFIED")
    bl.on_scheduled_backup(scheduled("gone"), "DELETED")
    assert bl.scheduled.queue.waiting()["new"] == 1


class Recorded(EventRecorder):
    """Keeps the Events instead of posting them."""

    def __init__(self) -> None:
        super().__init__(NO_API, "test")
        self.posted: list[tuple[str, str]] = []

    async def record(self, cluster: dict[str, Any], event_type: str, reason: str, message: str) -> bool:
        self.posted.append((event_type, reason))
        return True


async def test_an_event_once_per_reason_until_it_changes() -> None:
    recorder = Recorded()
    notices = Notices(recorder)
    key = (NS, "db")
    for reason in ("InvalidCredentials", "InvalidCredentials", "EndpointUnreachable", "InvalidCredentials"):
        await notices.once(key, cluster(), "Warning", reason, "m")
    assert recorder.posted == [("Warning", "InvalidCredentials"), ("Warning", "EndpointUnreachable"),
                               ("Warning", "InvalidCredentials")]  # fmt: skip
    assert notices.sent(key, "Warning")
    notices.forget(key)
    assert not notices.sent(key, "Warning")


async def test_passes_that_need_no_request() -> None:
    c = cache()
    metrics = Metrics()
    notices = Notices(Recorded())
    ownership = StoreOwnership(NO_API, c, lambda: T0)
    backups = BackupReconciler(NO_API, c, NO_EXEC, notices, ownership, cluster_news=lambda _: None,
                               backup_completed=lambda _: None, clock=lambda: T0)  # fmt: skip
    assert (await backups.reconcile((NS, "db", "nosuch"))).gone
    c.observe(backup("done", "db", phase="Completed"), None)
    done = await backups.reconcile((NS, "db", "done"))
    assert not done.gone and done.requeue_after is None

    sched = ScheduledBackupReconciler(NO_API, c, notices, clock=lambda: T0)
    assert (await sched.reconcile((NS, "nosuch"))).gone
    c.observe(scheduled("going", deleting=True), None)
    assert (await sched.reconcile((NS, "going"))).requeue_after is None

    clusters = ClusterBackupReconciler(
        NO_API, c, metrics, NO_EXEC, notices, ownership, backoff=BACKOFF, clock=lambda: T0
    )
    metrics.set_last_archived((NS, "db"), T0.timestamp())
    assert (await clusters.reconcile((NS, "db"))).gone  # not in the cache
    assert (NS, "db") not in metrics._last_archived
    # A cluster without spec.backup and no backup condition: nothing to write, nothing to come back for.
    c.observe(cluster("db"), None)
    c.observe({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "db-0", "namespace": NS, "uid": "p",
               "labels": {CLUSTER_LABEL: "db"}}}, None)  # fmt: skip
    plain = await clusters.reconcile((NS, "db"))
    assert not plain.gone and plain.requeue_after is None
