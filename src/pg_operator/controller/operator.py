"""The operator process: health endpoints, Lease gate, then kopf + the reconcile workers while leader.

Exit codes: 0 after a clean stop (signal), 1 when the Lease was lost or kopf failed — the Deployment
restarts the pod, which becomes a candidate again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kopf
from lightkube.core.exceptions import ApiError

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller import cache_sync
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.backup_reconcilers.loops import BackupLoops
from pg_operator.controller.cache import STORAGE_CLASS_KIND, Cache, WatchedKind, listed_kinds, watched_kinds
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.health import HealthServer, HealthState
from pg_operator.controller.heap_trim import Trimmer
from pg_operator.controller.kopf_diffbase import EmptyDiffBase
from pg_operator.controller.kopf_memories import ForgetfulMemories
from pg_operator.controller.kube_api import SERVICE_ACCOUNT_DIR, Api, load_config
from pg_operator.controller.lease import LeaseConfig, LeaseElector, LeaseLost
from pg_operator.controller.loop import ReconcileLoop
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.reconcile import Reconciler, namespace_terminating
from pg_operator.controller.rooms.storage import STORAGE_CLASSES_UNREADABLE, storage_classes_readable
from pg_operator.controller.wakeups import Wakeups, build_registry
from pg_operator.specs import MANAGED_KINDS

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_LEASE_NAMESPACE = "pg-operator-system"


def namespace_being_deleted(exc: Exception) -> str | None:
    """The cluster loop's final failure: a write refused because the namespace is going, and the
    cluster with it (reconcile.namespace_terminating)."""
    if isinstance(exc, ApiError) and namespace_terminating(exc):
        return "its namespace is being deleted"
    return None


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def default_lease_namespace() -> str:
    ns_file = SERVICE_ACCOUNT_DIR / "namespace"
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if ns_file.is_file():
        return ns_file.read_text().strip()
    return DEFAULT_LEASE_NAMESPACE


@dataclass
class Options:
    namespaces: list[str] = field(default_factory=list)  # empty: cluster-wide
    lease_namespace: str = DEFAULT_LEASE_NAMESPACE
    lease_name: str = "pg-operator-leader"
    lease_duration: int = 15
    identity: str = field(default_factory=default_identity)
    bind_address: str = "127.0.0.1"
    health_port: int = 8080
    metrics_port: int = 8081
    workers: int = 16
    resync_seconds: float = 300.0
    backup_retention_seconds: float = 600.0  # how often retention runs besides after each backup
    ca_trust_period_seconds: float = 90.0  # how long a CA rotation trusts both CAs (specs/ca_rotation.py)


@dataclass(frozen=True)
class ChildResources:
    """Matches the child kinds' resources (by group and plural), for kopf's per-resource settings."""

    names: frozenset[tuple[str, str]]

    def __call__(self, resource: kopf.Resource) -> bool:
        return (resource.group, resource.plural) in self.names


def kopf_settings(kinds: list[WatchedKind] | None = None) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.posting.enabled = False  # our own Events only; kopf's would be writes on every log line
    settings.scanning.disabled = True  # no CRD watching: the resources are known
    settings.persistence.diffbase_storage = EmptyDiffBase()  # no change-detecting handlers (kopf_diffbase)
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # What a restart holds at once: kopf lists each kind in one response unless told to page, and each
    # object's worker keeps its last body while it idles (5 s by default); the cache has packed it already.
    settings.watching.chunk_size = 100
    settings.queueing.idle_timeout = 1.0
    # The child handlers only take objects carrying the cluster label; asking the API server for those
    # alone keeps every other Pod, Secret, ConfigMap … of the watched namespaces out of this process
    # (kopf would otherwise parse each one and keep per-object state for it, then drop it).
    children = kinds if kinds is not None else watched_kinds(MANAGED_KINDS)
    selector = ChildResources(frozenset((k.group, k.plural) for k in children))
    settings.watching.label_selectors[selector] = CLUSTER_LABEL
    return settings


async def unless_stopped(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> tuple[bool, T | None]:
    """Await `work` unless `stop` is set first: (True, its result), or (False, None) with it cancelled.
    An exception of `work` is raised (a failed lease acquisition must not look like leadership)."""
    task = asyncio.create_task(work)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        task.cancel()
        return False, None
    stopping.cancel()
    return True, task.result()

async def may_read_storage_classes(api: Api, opts: Options) -> bool:
    """A cluster-wide install holds StorageClass reads (deploy/operator/rbac.yaml); a namespaced one may
    not (deploy/namespaced/): the API server's authorizer says, asked until it answers."""
    if not opts.namespaces:
        return True
    backoff = Backoff()
    failures = 0
    while True:
        try:
            readable = await storage_classes_readable(api)
            break
        except Exception as exc:
            failures += 1
            delay = backoff.delay(failures)
            log.warning("asking whether StorageClasses are readable failed, retrying in %.1fs: %s",
                        delay, exc)  # fmt: skip
            await asyncio.sleep(delay)
    if not readable:
        log.warning("%s", STORAGE_CLASSES_UNREADABLE)
    return readable


async def run(opts: Options) -> int:
    metrics = Metrics()
    api = Api(metrics)
    # A client of its own: a renewal never waits for a connection behind a burst of reconcile writes.
    lease_api = Api(metrics)
    elector = LeaseElector(
        lease_api,
        LeaseConfig(
            namespace=opts.lease_namespace,
            name=opts.lease_name,
            identity=opts.identity,
            duration=opts.lease_duration,
            renew_period=min(2.0, opts.lease_duration / 6),
            expiry_margin=min(2.0, opts.lease_duration / 6),
        ),
    )
    kopf_ready = asyncio.Event()
    kinds = watched_kinds(MANAGED_KINDS)
    listed = listed_kinds(kinds, CLUSTER_LABEL)
    gate = cache_sync.SyncGate(k.key for k in listed)  # opens once the cache has seen everything
    state = HealthState()
    state.ready = lambda: (
        (state.role == "leader" and kopf_ready.is_set() and gate.open)
        or (state.role == "candidate" and elector.last_error is None)
    )
    state.detail = lambda: {
        "identity": opts.identity,
        "leaseError": elector.last_error,
        # What an unready leader's cache still waits for (empty once synced, and for a candidate).
        "cacheWaitingFor": {f"{v} {k}": n for (v, k), n in gate.waiting_for().items()}
        if state.role == "leader" else {},
    }
    server = HealthServer(
        state, metrics, bind=opts.bind_address, health_port=opts.health_port, metrics_port=opts.metrics_port
    )
    await server.start()

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        done, readable = await unless_stopped(may_read_storage_classes(api, opts), stop)
        if not done:
            return 0
        storage_classes = bool(readable)
        if not storage_classes:
            listed = [k for k in listed if k.key != STORAGE_CLASS_KIND]
            gate = cache_sync.SyncGate(k.key for k in listed)
        state.role = "candidate"
        log.info("candidate %s for lease %s/%s", opts.identity, opts.lease_namespace, opts.lease_name)
        done, _ = await unless_stopped(elector.acquire(), stop)
        if not done:
            return 0
        state.role = "leader"
        metrics.leader.set(1)
        log.info("leading as %s; starting the controller", opts.identity)
        return await _lead(opts, api, elector, metrics, stop, kopf_ready, state, kinds, listed, gate,
                           storage_classes=storage_classes)  # fmt: skip
    finally:
        metrics.leader.set(0)
        state.role = "stopping"
        await elector.release()
        await server.stop()
        await api.close()
        await lease_api.close()


def _log_backup_workers_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        log.error("backup workers stopped: %r", task.exception())


async def _lead(
    opts: Options,
    api: Api,
    elector: LeaseElector,
    metrics: Metrics,
    stop: asyncio.Event,
    kopf_ready: asyncio.Event,
    state: HealthState,
    kinds: list[WatchedKind],
    listed: list[cache_sync.ListedKind],
    gate: cache_sync.SyncGate,
    *,
    storage_classes: bool = True,
) -> int:
    cache = Cache(kinds, gate)
    cache.storage_classes_readable = storage_classes
    pod_exec = PodExec(load_config(), metrics)
    reconciler = Reconciler(api, cache, metrics, EventRecorder(api, opts.identity), pod_exec,
                            ca_trust_period=dt.timedelta(seconds=opts.ca_trust_period_seconds))
    controller = ReconcileLoop(reconciler, metrics, workers=opts.workers, resync_seconds=opts.resync_seconds,
                               gives_up=namespace_being_deleted,
                               on_failure=reconciler.report_failure)  # fmt: skip
    backups = BackupLoops(api, cache, metrics, pod_exec, opts.identity,
                          retention_seconds=opts.backup_retention_seconds)  # fmt: skip
    registry = build_registry(Wakeups(controller, cache, backups), kinds, storage_classes=storage_classes)
    kopf_stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    kopf_task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=kopf_settings(kinds),
            standalone=True,
            clusterwide=not opts.namespaces,
            namespaces=opts.namespaces,
            stop_flag=kopf_stop,
            ready_flag=kopf_ready,
            memories=ForgetfulMemories(),  # kopf_memories.py: no per-object state kept
        ),
        name="kopf",
    )
    # kopf installs its own SIGINT/SIGTERM handlers; ours are put back so a signal means a clean stop.
    await asyncio.sleep(0.5)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    syncing = asyncio.create_task(cache_sync.sync(api, gate, listed, opts.namespaces), name="cache-sync")
    cache.pruner = cache_sync.RelistPruner(api, listed, opts.namespaces, cache.prune, controller.wake)
    pruning = asyncio.create_task(cache.pruner.run(), name="cache-prune")

    async def once_synced(work: Coroutine[Any, Any, None]) -> None:
        # Nothing acts on a cache that has not seen everything yet (cache_sync's docstring says why).
        try:
            await gate.wait()
        except BaseException:
            work.close()
            raise
        await work

    workers = asyncio.create_task(once_synced(controller.run()), name="reconcile-workers")
    # Not among the tasks that end the process: backups failing must not stop the clusters' reconciles.
    backup_workers = asyncio.create_task(once_synced(backups.run()), name="backup-workers")
    backup_workers.add_done_callback(_log_backup_workers_end)
    holding = asyncio.create_task(elector.hold(), name="lease")
    stopping = asyncio.create_task(stop.wait(), name="stop")
    trimming = asyncio.create_task(Trimmer().run(), name="heap-trim")  # heap_trim.py: RSS back after bursts
    done, _ = await asyncio.wait({kopf_task, workers, holding, stopping}, return_when=asyncio.FIRST_COMPLETED)

    code = 0
    if holding in done:
        exc = holding.exception()
        log.error("lost leadership, exiting: %s", exc if isinstance(exc, LeaseLost) else repr(exc))
        code = 1
    elif kopf_task in done:
        # kopf returns normally after a signal it caught itself; anything else is a failure.
        failure = kopf_task.exception()
        if failure is not None:
            log.error("kopf stopped unexpectedly: %r", failure)
            code = 1
        else:
            log.info("stopping on signal (via kopf)")
    elif workers in done:
        log.error("reconcile workers stopped unexpectedly: %r", workers.exception())
        code = 1
    else:
        log.info("stopping on signal")

    # Stop acting first (in-flight reconciles are cancelled), then the watches.
    state.role = "stopping"
    syncing.cancel()
    pruning.cancel()
    workers.cancel()
    controller.close()
    backup_workers.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await backup_workers
    await backups.close()
    holding.cancel()
    stopping.cancel()
    trimming.cancel()
    kopf_stop.set()
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
        await asyncio.wait_for(kopf_task, timeout=10)
    for task in (syncing, pruning, workers, holding, trimming):
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    if holding in done:
        elector.is_leader = False  # nothing to release: it is not ours any more
    return code
