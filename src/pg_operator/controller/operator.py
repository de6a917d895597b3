"""The operator process: health endpoints, Lease gate, then the informers and the reconcile workers while
leader.

Exit codes: 0 after a clean stop (signal), 1 when the Lease was lost or the informers or workers failed —
the Deployment restarts the pod, which becomes a candidate again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lightkube.core.exceptions import ApiError

from pg_operator.api.image_policy import AllowedRepositories
from pg_operator.backup.store_policy import StoreLimits
from pg_operator.controller import cache_sync
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.backup_reconcilers.loops import BackupLoops
from pg_operator.controller.cache import Cache, WatchedKind, watched_kinds
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.health import HealthServer, HealthState
from pg_operator.controller.heap_trim import Trimmer
from pg_operator.controller.informer import Informers
from pg_operator.controller.kube_api import SERVICE_ACCOUNT_DIR, Api, load_config
from pg_operator.controller.lease import LeaseConfig, LeaseElector, LeaseLost
from pg_operator.controller.loop import ReconcileLoop
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.nodes import NODES_UNREADABLE, nodes_readable
from pg_operator.controller.pod_exec import PodExec
from pg_operator.controller.reconcile import Reconciler, namespace_terminating
from pg_operator.controller.reconcilers.storage import STORAGE_CLASSES_UNREADABLE, storage_classes_readable
from pg_operator.controller.secret_reads import api_reader
from pg_operator.controller.wakeups import Wakeups, feeds
from pg_operator.images import ImageSettings, configure
from pg_operator.specs import MANAGED_KINDS
from pg_operator.specs.network_policy import DEFAULT_MONITORING_NAMESPACE

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
    backup_retention_seconds: float = 600.0  # how long a failed retention waits before it is tried again
    ca_trust_period_seconds: float = 90.0  # how long a CA rotation trusts both CAs (specs/ca_rotation.py)
    # Whose pods may scrape the instances and poolers when a cluster's metricsFrom is unset ("": none).
    monitoring_namespace: str = DEFAULT_MONITORING_NAMESPACE
    # What spec.image may name (api/image_policy.py); a cluster naming another image is refused.
    allowed_image_repositories: AllowedRepositories = field(default_factory=AllowedRepositories)
    store_limits: StoreLimits = field(default_factory=StoreLimits)  # calls to tenants' object stores
    # Where the pods' images come from and the Secrets to pull them with (images.py).
    images: ImageSettings = field(default_factory=ImageSettings)


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


async def may_read(what: str, ask: Callable[[], Awaitable[bool]], unreadable: str) -> bool:
    """A cluster-wide install holds the reads of cluster-scoped kinds (deploy/operator/rbac.yaml); a
    namespaced one may not (deploy/namespaced/), nor may one whose ClusterRole predates a kind's reads: the
    API server's authorizer says, asked until it answers (a listing it refuses would be waited on forever)."""
    backoff = Backoff()
    failures = 0
    while True:
        try:
            readable = await ask()
            break
        except Exception as exc:
            failures += 1
            delay = backoff.delay(failures)
            log.warning("asking whether %s are readable failed, retrying in %.1fs: %s", what, delay, exc)
            await asyncio.sleep(delay)
    if not readable:
        log.warning("%s", unreadable)
    return readable


async def may_read_storage_classes(api: Api) -> bool:
    return await may_read("StorageClasses", lambda: storage_classes_readable(api),
                          STORAGE_CLASSES_UNREADABLE)  # fmt: skip


async def may_read_nodes(api: Api) -> bool:
    return await may_read("Nodes", lambda: nodes_readable(api), NODES_UNREADABLE)


async def run(opts: Options) -> int:
    # Before anything builds a pod: the builders read the image settings as a constant.
    configure(opts.images)
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
    kinds = watched_kinds(MANAGED_KINDS)
    gate = cache_sync.SyncGate()  # opens once the cache has seen everything (told what, once leading)
    state = HealthState()
    state.ready = lambda: (
        (state.role == "leader" and gate.open) or (state.role == "candidate" and elector.last_error is None)
    )
    state.detail = lambda: {
        "identity": opts.identity,
        "leaseError": elector.last_error,
        # What an unready leader's cache still waits for (empty once synced, and for a candidate).
        "cacheWaitingFor": {f"{v} {k}": n for (v, k), n in gate.waiting_for().items()}
        if state.role == "leader"
        else {},
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
        done, readable = await unless_stopped(may_read_storage_classes(api), stop)
        if not done:
            return 0
        storage_classes = bool(readable)
        done, readable = await unless_stopped(may_read_nodes(api), stop)
        if not done:
            return 0
        nodes = bool(readable)
        state.role = "candidate"
        log.info("candidate %s for lease %s/%s", opts.identity, opts.lease_namespace, opts.lease_name)
        done, _ = await unless_stopped(elector.acquire(), stop)
        if not done:
            return 0
        state.role = "leader"
        metrics.leader.set(1)
        log.info("leading as %s; starting the controller", opts.identity)
        return await _lead(opts, api, elector, metrics, stop, state, kinds, gate,
                           storage_classes=storage_classes, nodes=nodes)  # fmt: skip
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
    state: HealthState,
    kinds: list[WatchedKind],
    gate: cache_sync.SyncGate,
    *,
    storage_classes: bool = True,
    nodes: bool = True,
) -> int:
    cache = Cache(kinds, gate)
    cache.storage_classes_readable = storage_classes
    cache.nodes_readable = nodes
    pod_exec = PodExec(load_config(), metrics)
    reconciler = Reconciler(api, cache, metrics, EventRecorder(api, opts.identity), pod_exec,
                            ca_trust_period=dt.timedelta(seconds=opts.ca_trust_period_seconds),
                            allowed_images=opts.allowed_image_repositories,
                            monitoring_namespace=opts.monitoring_namespace)  # fmt: skip
    controller = ReconcileLoop(reconciler, metrics, workers=opts.workers, resync_seconds=opts.resync_seconds,
                               gives_up=namespace_being_deleted,
                               on_failure=reconciler.report_failure)  # fmt: skip
    backups = BackupLoops(api, cache, metrics, pod_exec, opts.identity,
                          retention_seconds=opts.backup_retention_seconds,
                          store_limits=opts.store_limits)  # fmt: skip
    wakeups = Wakeups(controller, cache, backups, api_reader(api))
    # A client of its own: the watches' streams never wait behind the reconciles' writes.
    watch_api = Api(metrics, for_watches=True)
    informers = Informers(watch_api, feeds(wakeups, kinds, storage_classes=storage_classes, nodes=nodes),
                          opts.namespaces, wakeups.listed)  # fmt: skip
    gate.expect(informers.awaited())
    watching = asyncio.create_task(informers.run(), name="informers")

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
    done, _ = await asyncio.wait({watching, workers, holding, stopping}, return_when=asyncio.FIRST_COMPLETED)

    code = 0
    if holding in done:
        exc = holding.exception()
        log.error("lost leadership, exiting: %s", exc if isinstance(exc, LeaseLost) else repr(exc))
        code = 1
    elif watching in done:
        log.error("informers stopped unexpectedly: %r", watching.exception())
        code = 1
    elif workers in done:
        log.error("reconcile workers stopped unexpectedly: %r", workers.exception())
        code = 1
    else:
        log.info("stopping on signal")

    # Stop acting first (in-flight reconciles are cancelled), then the watches.
    state.role = "stopping"
    workers.cancel()
    controller.close()
    backup_workers.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await backup_workers
    await backups.close()
    holding.cancel()
    stopping.cancel()
    trimming.cancel()
    watching.cancel()
    for task in (workers, holding, trimming, watching):
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await watch_api.close()
    if holding in done:
        elector.is_leader = False  # nothing to release: it is not ours any more
    return code
