"""The clusters both halves of the scale bench create and wait for: the PostgresCluster kind, creating N
of them, readiness as the operator's Ready condition counts it, and the stand-in for Patroni's role
labels."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lightkube import Client, KubeConfig, codecs, operators
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from harness.audit import AUDIT_LOG, Audit
from harness.kube import ExternalKube
from harness.objects import CLUSTER_LABEL, cluster
from harness.operator_process import OperatorProcess
from harness.paths import STATE
from scale.measure import progress

PGC = create_namespaced_resource("db.example.com", "v1alpha1", "PostgresCluster", "postgresclusters")
STORAGE_CLASS = "bench-prebound"


class RoleLabeller:
    """Labels instance pods role=primary (ordinal 0) / role=replica, as Patroni does in real pods.

    Once per pod (by uid): a pod's several status events before the label shows up in one would each
    have patched it again. The patches go through a few threads, so the stand-in keeps up with a burst
    of thousands of pods (one thread patching every event managed ~70 pods a minute at 1000 clusters).
    """

    def __init__(self, config: KubeConfig, workers: int = 4) -> None:
        self.config = config
        self.client = Client(config, field_manager="bench-patroni-stand-in")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="role-labeller")
        self._local = threading.local()
        self._handled: set[str] = set()
        self.patched = 0

    def __enter__(self) -> RoleLabeller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _patch(self, name: str, namespace: str | None, role: str) -> None:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.config, field_manager="bench-patroni-stand-in")
        with contextlib.suppress(ApiError):
            client.patch(
                Pod,
                name,
                {"metadata": {"labels": {"role": role}}},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
            self.patched += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for kind, pod in self.client.watch(
                    Pod, namespace="*", labels={CLUSTER_LABEL: operators.exists()}
                ):
                    if self._stop.is_set():
                        return
                    meta = pod.metadata
                    labels = (meta.labels if meta else None) or {}
                    if kind == "DELETED" or meta is None or not meta.name or not meta.uid or "role" in labels:
                        continue
                    if meta.uid in self._handled:
                        continue
                    self._handled.add(meta.uid)
                    cluster = labels[CLUSTER_LABEL]
                    role = "primary" if meta.name == f"{cluster}-0" else "replica"
                    self._pool.submit(self._patch, meta.name, meta.namespace, role)
            except Exception:  # watch expired or connection dropped: resume
                time.sleep(0.5)


def ensure_namespace(client: Client, name: str) -> None:
    try:
        client.create(Namespace(metadata={"name": name}))  # type: ignore[arg-type]
    except ApiError as exc:
        if exc.status.code != 409:
            raise


def cluster_names(n: int, first: int = 0) -> list[str]:
    return [f"c{i:04d}" for i in range(first, first + n)]


def cluster_bodies(ns: str, n: int, replicas: int, first: int = 0) -> list[dict[str, Any]]:
    # Small requests, so that both halves' pods fit on the fake node (64 CPUs, 512Gi).
    return [cluster(name, ns, replicas=replicas, storageClassName=STORAGE_CLASS,
                    resources={"requests": {"cpu": "10m", "memory": "128Mi"}})
            for name in cluster_names(n, first)]  # fmt: skip


def create_clusters(client: Client, ns: str, n: int, replicas: int, first: int = 0) -> list[Any]:
    return [client.create(codecs.from_dict(body)) for body in cluster_bodies(ns, n, replicas, first)]


def wait_all(what: str, count: Any, expected: int, timeout: float, op: OperatorProcess | None = None) -> None:
    """Poll `count()` until it reaches `expected`; progress every minute; fail at once if the operator
    process died (a Deployment would restart it, the bench does not)."""
    deadline = time.monotonic() + timeout
    last_report = 0.0
    seen = 0
    while time.monotonic() < deadline:
        if op is not None and not op.alive():
            raise RuntimeError(f"the operator exited while waiting for {what} ({seen}/{expected})")
        with contextlib.suppress(Exception):  # a slow or refused LIST is retried
            seen = count()
        if seen >= expected:
            return
        if time.monotonic() - last_report > 60:
            last_report = time.monotonic()
            progress(f"{what}: {seen}/{expected}, load {os.getloadavg()[0]:.1f}")
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} ({seen}/{expected})")


def clusters_with(client: Client, ns: str, condition: str) -> int:
    """How many PostgresClusters in `ns` have `condition` True."""
    count = 0
    for obj in client.list(PGC, namespace=ns):
        status = obj.get("status") or {} if isinstance(obj, dict) else (obj.status or {})
        for cond in status.get("conditions") or ():
            if cond.get("type") == condition and cond.get("status") == "True":
                count += 1
    return count


def ready_clusters(client: Client, ns: str) -> int:
    return clusters_with(client, ns, "Ready")


def statefulset_replicas(client: Client, ns: str, name: str) -> int | None:
    from lightkube.resources.apps_v1 import StatefulSet

    try:
        sts = client.get(StatefulSet, name, namespace=ns)
    except ApiError:
        return None
    return sts.spec.replicas if sts.spec else None


def connect() -> tuple[Audit, ExternalKube, KubeConfig, Client]:
    """The local cluster a bench measures (PGOP_TEST_KUBECONFIG, else the state directory's admin
    kubeconfig): the audit log, kubectl, the admin config and a client."""
    kubeconfig = os.environ.get("PGOP_TEST_KUBECONFIG") or str(STATE / "admin.kubeconfig")
    admin = KubeConfig.from_file(kubeconfig)
    return Audit(AUDIT_LOG), ExternalKube(kubeconfig), admin, Client(admin, field_manager="bench")
