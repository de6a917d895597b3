"""Scale benchmark of the reconcile loop on the kwok profile. Prints one JSON line.

N PostgresClusters of R instances each, handled by the operator (subprocess, its own ServiceAccount):
time until all are Ready, the operator's peak RSS, API requests per cluster (audit log, by the operator's
user), and the requests of one steady-state resync of all clusters. Side by side, the floor: a plain
script creating the same children directly (same builders, same concurrency: eight clusters at a time,
a cluster's children in the same two waves of concurrent writes as the operator's eight workers send
them) for N other clusters, and
waiting for the same readiness as the operator's Ready condition (every instance ready, and a ready
primary: pods are labelled with their role as Patroni would, by the same stand-in in both halves).

Volumes are the same for both halves and out of the timed phase. Binding is not what is measured, and
kube-controller-manager's PV controller binds one claim at a time (~55 a minute on the loaded 2-core
machine: ~1 h for 3000 claims, in each half), so before the clock starts the bench creates, for every
claim the StatefulSets will use (`data-<cluster>-<ordinal>`, the claim template's exact labels and
spec), the claim and its PersistentVolume already bound to each other (volumeName, claimRef with the
claim's uid, bind-completed, both statuses Bound; a StorageClass of the bench's own, no provisioner).
The StatefulSet controller finds the claims and creates none; the PV controller finds nothing to do.

Also measured: the operator's steady RSS after the resync window, the load average (the machine is
shared, so a run's times only compare with runs of the same moment), and with --probe the latency of one
change made in the middle of the burst: a cluster that was Ready before the burst is scaled 1 → 2 right
after the N clusters are created, and the time until its StatefulSet carries the new size is reported
(is a single change starved behind the backlog?). With --restart, after the resync window a fresh
operator process starts over the converged clusters: seconds until it leads with its cache synced (it
is ready then), until every cluster has had a pass, its peak RSS, and what it asked of the API server
meanwhile (a converged cluster needs no write).

    .venv/bin/python bench/bench_reconcile_scale.py --clusters 50 --probe --restart
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
sys.path.insert(0, str(REPO / "tests"))

import httpx2  # noqa: E402  (lightkube's HTTP client: its timeouts)
from lightkube import AsyncClient, Client, KubeConfig, codecs, operators  # noqa: E402
from lightkube.core.exceptions import ApiError  # noqa: E402
from lightkube.generic_resource import create_namespaced_resource  # noqa: E402
from lightkube.resources.core_v1 import Namespace, Pod  # noqa: E402
from lightkube.types import PatchType  # noqa: E402
from test_operator_harness import (  # noqa: E402
    AUDIT_LOG,
    CLUSTER_LABEL,
    Audit,
    ExternalKube,
    OperatorProcess,
    install_operator_identity,
    operator_kubeconfig,
    postgres_cluster,
    wait_until,
)

from pg_operator.api.cluster import PostgresCluster  # noqa: E402
from pg_operator.controller.kube_api import MAX_IN_FLIGHT, resource_for  # noqa: E402
from pg_operator.controller.reconcile import SECOND_WAVE  # noqa: E402
from pg_operator.specs import ClusterPasswords, build_secrets, desired_children  # noqa: E402

PGC = create_namespaced_resource("db.example.com", "v1alpha1", "PostgresCluster", "postgresclusters")
STORAGE_CLASS = "bench-prebound"
VOLUME_NS_LABEL = "bench.pg-operator/claim-namespace"
CLAIM_TEMPLATE = "data"  # the StatefulSet's volumeClaimTemplate (contracts.md: PVC `data`)
TEMPLATE_CLUSTER = "c0000"


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


def cluster_names(n: int) -> list[str]:
    return [f"c{i:04d}" for i in range(n)]


def create_clusters(client: Client, ns: str, n: int, replicas: int) -> list[Any]:
    out = []
    for name in cluster_names(n):
        # Small requests, so that both halves' pods fit on the fake node (64 CPUs, 512Gi).
        body = postgres_cluster(
            name,
            ns,
            replicas=replicas,
            storageClassName=STORAGE_CLASS,
            resources={"requests": {"cpu": "10m", "memory": "128Mi"}},
        )
        out.append(client.create(codecs.from_dict(body)))
    return out


def ensure_storage_class(client: Client) -> None:
    """No provisioner, Immediate: a claim binds to its pre-created volume as soon as it exists."""
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }
    try:
        client.create(codecs.from_dict(body))
    except ApiError as exc:
        if exc.status.code != 409:
            raise


def claims_of(clusters: list[str], replicas: int) -> list[tuple[str, int]]:
    return [(c, i) for c in clusters for i in range(replicas)]


def claim_template(ns: str, replicas: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The StatefulSet's claim template and selector labels, from the same builders the operator uses."""
    body = postgres_cluster(TEMPLATE_CLUSTER, ns, replicas=replicas, storageClassName=STORAGE_CLASS)
    body["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    sts = next(c for c in desired_children(PostgresCluster.from_obj(body)) if c["kind"] == "StatefulSet")
    return sts["spec"]["volumeClaimTemplates"][0], dict(sts["spec"]["selector"]["matchLabels"])


def volume_name(ns: str, claim: str) -> str:
    return f"bench-{ns}-{claim}"


def claim_body(
    ns: str, cluster: str, ordinal: int, template: dict[str, Any], selector: dict[str, str]
) -> dict[str, Any]:
    """The claim as the StatefulSet controller would create it (template labels + selector labels), but
    already bound to its volume."""
    labels = {**(template["metadata"].get("labels") or {}), **selector}
    labels = {k: cluster if v == TEMPLATE_CLUSTER else v for k, v in labels.items()}
    name = f"{CLAIM_TEMPLATE}-{cluster}-{ordinal}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels,
            "annotations": {"pv.kubernetes.io/bind-completed": "yes"},
        },
        "spec": {**template["spec"], "volumeName": volume_name(ns, name)},
    }


def volume_body(ns: str, claim: str, claim_uid: str, size: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume_name(ns, claim), "labels": {VOLUME_NS_LABEL: ns}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/tmp/kwok-pv/{ns}/{claim}"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": ns,
                "name": claim,
                "uid": claim_uid,
            },
        },
    }


async def bind_volumes_async(
    config: KubeConfig, ns: str, claims: list[tuple[str, int]], replicas: int, workers: int
) -> None:
    from lightkube.resources.core_v1 import PersistentVolumeClaimStatus, PersistentVolumeStatus

    template, selector = claim_template(ns, replicas)
    size = template["spec"]["resources"]["requests"]["storage"]
    client = AsyncClient(config, field_manager="bench-volumes")
    sem = asyncio.Semaphore(workers)
    claim_status = {
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}
    }

    async def one(cluster: str, ordinal: int) -> None:
        body = claim_body(ns, cluster, ordinal, template, selector)
        name = body["metadata"]["name"]
        async with sem:
            pvc = await client.create(codecs.from_dict(body))
            assert pvc.metadata is not None and pvc.metadata.uid
            await client.create(codecs.from_dict(volume_body(ns, name, pvc.metadata.uid, size)))
            await client.patch(
                PersistentVolumeClaimStatus, name, claim_status, namespace=ns, patch_type=PatchType.MERGE
            )
            await client.patch(
                PersistentVolumeStatus,
                volume_name(ns, name),
                {"status": {"phase": "Bound"}},
                patch_type=PatchType.MERGE,
            )

    try:
        await asyncio.gather(*(one(c, i) for c, i in claims))
    finally:
        await client.close()


def bound_claims(client: Client, ns: str) -> int:
    from lightkube.resources.core_v1 import PersistentVolumeClaim

    return sum(
        1
        for pvc in client.list(PersistentVolumeClaim, namespace=ns)
        if pvc.status is not None
        and pvc.status.phase == "Bound"
        and pvc.spec is not None
        and pvc.spec.volumeName
    )


def prepare_volumes(
    client: Client, config: KubeConfig, ns: str, claims: list[tuple[str, int]], replicas: int, timeout: float
) -> float:
    """Create the half's bound claim/volume pairs; returns the seconds it took (not timed)."""
    started = time.monotonic()
    progress(f"creating {len(claims)} bound claims and volumes in {ns}")
    asyncio.run(bind_volumes_async(config, ns, claims, replicas, workers=16))
    wait_until(
        f"{len(claims)} claims Bound", lambda: bound_claims(client, ns) >= len(claims), timeout=timeout
    )
    return time.monotonic() - started


async def delete_volumes_async(config: KubeConfig, ns: str, workers: int = 16) -> None:
    from lightkube.resources.core_v1 import PersistentVolume

    client = AsyncClient(config, field_manager="bench-volumes")
    sem = asyncio.Semaphore(workers)
    names = [
        pv.metadata.name
        async for pv in client.list(PersistentVolume, labels={VOLUME_NS_LABEL: ns})
        if pv.metadata is not None and pv.metadata.name
    ]

    async def one(name: str) -> None:
        async with sem:
            with contextlib.suppress(ApiError):
                await client.delete(PersistentVolume, name)

    try:
        await asyncio.gather(*(one(n) for n in names))
    finally:
        await client.close()


def delete_volumes(config: KubeConfig, ns: str) -> None:
    asyncio.run(delete_volumes_async(config, ns))


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


def ready_clusters(client: Client, ns: str) -> int:
    count = 0
    for obj in client.list(PGC, namespace=ns):
        status = obj.get("status") or {} if isinstance(obj, dict) else (obj.status or {})
        for cond in status.get("conditions") or ():
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                count += 1
    return count


def ready_floor_clusters(client: Client, ns: str, replicas: int) -> int:
    """The operator's Ready, without the operator: every instance ready and a ready primary (pod
    `<cluster>-0` labelled role=primary by the stand-in)."""
    from lightkube.resources.apps_v1 import StatefulSet

    primaries = set()
    for pod in client.list(Pod, namespace=ns, labels={"role": "primary"}):
        conditions = (pod.status.conditions if pod.status else None) or []
        if pod.metadata and any(c.type == "Ready" and c.status == "True" for c in conditions):
            primaries.add((pod.metadata.labels or {}).get(CLUSTER_LABEL))
    return sum(
        1
        for s in client.list(StatefulSet, namespace=ns)
        if s.status
        and (s.status.readyReplicas or 0) == replicas
        and s.metadata is not None
        and s.metadata.name in primaries
    )


FLOOR_ATTEMPTS = 5


async def floor_create(config: KubeConfig, clusters: list[Any], workers: int) -> int:
    """What the operator does for a new cluster, done directly and the same way: `workers` clusters at
    a time; each cluster's children in the operator's two waves (the RoleBinding and the StatefulSet
    after the rest and the Secrets); at most as many requests in flight as the operator's client."""
    client = AsyncClient(config, field_manager="bench-floor")
    sem = asyncio.Semaphore(workers)
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    requests = 0

    async def send(call: Any) -> None:
        # The operator retries a request the loaded API server did not answer in time; so does the
        # floor (a create whose first try went through then finds its object: that is success too).
        nonlocal requests
        for attempt in range(1, FLOOR_ATTEMPTS + 1):
            requests += 1
            try:
                async with slots:
                    await call()
                return
            except httpx2.TimeoutException:
                if attempt == FLOOR_ATTEMPTS:
                    raise
                progress(f"floor: a request timed out (try {attempt}); retrying")
            except ApiError as exc:
                if exc.status.code == 409 and attempt > 1:
                    return
                raise

    def apply(child: dict[str, Any], namespace: str) -> Any:
        res = resource_for(child["apiVersion"], child["kind"])
        name = child["metadata"]["name"]
        return lambda: client.patch(
            res, name, child, namespace=namespace, patch_type=PatchType.APPLY, force=True
        )

    async def one(obj: Any) -> None:
        cluster = PostgresCluster.from_obj(obj.to_dict() if hasattr(obj, "to_dict") else obj)
        children = desired_children(cluster)
        first = [c for c in children if c["kind"] not in SECOND_WAVE]
        second = [c for c in children if c["kind"] in SECOND_WAVE]
        secrets = build_secrets(cluster, ClusterPasswords.generate())
        async with sem:
            await asyncio.gather(
                *(send(apply(c, cluster.namespace)) for c in first),
                *(send(lambda s=s: client.create(codecs.from_dict(s))) for s in secrets),
            )
            await asyncio.gather(*(send(apply(c, cluster.namespace)) for c in second))

    await asyncio.gather(*(one(o) for o in clusters))
    await client.close()
    return requests


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def peak_rss_mib(pid: int, field: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def statefulset_replicas(client: Client, ns: str, name: str) -> int | None:
    from lightkube.resources.apps_v1 import StatefulSet

    try:
        sts = client.get(StatefulSet, name, namespace=ns)
    except ApiError:
        return None
    return sts.spec.replicas if sts.spec else None


class ProbeChange:
    """One change made during the burst, timed until the operator applied it (in a thread)."""

    def __init__(self, client: Client, ns: str, name: str) -> None:
        self.client, self.ns, self.name = client, ns, name
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ProbeChange:
        self._thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        self.client.patch(
            PGC, self.name, {"spec": {"replicas": 2}}, namespace=self.ns, patch_type=PatchType.MERGE
        )
        while time.monotonic() - started < 3600:
            if statefulset_replicas(self.client, self.ns, self.name) == 2:
                self.seconds = time.monotonic() - started
                progress(f"probe change applied after {self.seconds:.1f} s")
                return
            time.sleep(0.25)

    def join(self, timeout: float) -> float | None:
        self._thread.join(timeout)
        return self.seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="operator --workers and floor concurrency")
    parser.add_argument("--resync-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--keep", action="store_true", help="leave the floor half's namespace behind")
    parser.add_argument("--probe", action="store_true", help="time one change made during the burst")
    parser.add_argument("--no-floor", action="store_true", help="the operator half only")
    parser.add_argument("--no-operator", action="store_true", help="the floor half only")
    parser.add_argument(
        "--restart", action="store_true", help="then restart the operator over the converged clusters"
    )
    parser.add_argument("--label", default="", help="a name for this run in the JSON line (e.g. a commit)")
    args = parser.parse_args()

    kubeconfig = os.environ.get("PGOP_TEST_KUBECONFIG") or str(
        Path(os.environ.get("PGOP_STATE", "/var/lib/pg-operator-localkube")) / "admin.kubeconfig"
    )
    audit = Audit(Path(os.environ.get("PGOP_TEST_AUDIT_LOG", str(AUDIT_LOG))))
    kube = ExternalKube(kubeconfig)
    admin = KubeConfig.from_file(kubeconfig)
    client = Client(admin, field_manager="bench")
    stamp = time.strftime("%H%M%S")
    op_ns, floor_ns = f"bench-op-{stamp}", f"bench-floor-{stamp}"
    n, r = args.clusters, args.replicas
    result: dict[str, Any] = {
        "bench": "reconcile_scale",
        "clusters": n,
        "replicas": r,
        "workers": args.workers,
        "label": args.label,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }

    install_operator_identity(kube)
    work = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    op_config = operator_kubeconfig(kube, work / "operator.kubeconfig")
    ensure_storage_class(client)
    with RoleLabeller(admin):
        if not args.no_operator:
            run_operator_half(args, client, admin, kube, audit, op_config, work, op_ns, result)

        result["load_average_operator_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.no_floor:
            print(json.dumps(result))
            return 0
        run_floor_half(args, client, admin, floor_ns, result)
    if not args.keep:
        client.delete(Namespace, floor_ns)
        delete_volumes(admin, floor_ns)
    print(json.dumps(result))
    return 0


def metrics_of(op: OperatorProcess) -> dict[str, float]:
    """The operator's metrics; a starved operator can take more than the harness's 2 s to answer."""
    deadline = time.monotonic() + 120
    while True:
        try:
            metrics: dict[str, float] = op.metrics()
            return metrics
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def run_operator_half(
    args: argparse.Namespace,
    client: Client,
    admin: KubeConfig,
    kube: ExternalKube,
    audit: Audit,
    op_config: Path,
    work: Path,
    op_ns: str,
    result: dict[str, Any],
) -> None:
    n, r = args.clusters, args.replicas
    if True:
        # --- the operator -----------------------------------------------------------------------
        ensure_namespace(client, op_ns)
        op_claims = claims_of(cluster_names(n), r) + (claims_of(["probe"], 2) if args.probe else [])
        result["volumes_seconds_operator"] = round(
            prepare_volumes(client, admin, op_ns, op_claims, r, args.timeout), 1
        )
        op = OperatorProcess(
            op_config,
            work,
            "bench",
            "--namespace",
            op_ns,
            "--workers",
            str(args.workers),
            "--resync-seconds",
            str(args.resync_seconds),
            "--log-level",
            "warning",
        ).start()
        op.wait_leader(timeout=120)
        probe: ProbeChange | None = None
        if args.probe:
            client.create(
                codecs.from_dict(postgres_cluster("probe", op_ns, replicas=1, storageClassName=STORAGE_CLASS))
            )
            wait_until("the probe cluster Ready", lambda: ready_clusters(client, op_ns) == 1, timeout=300)
        expected = n + (1 if args.probe else 0)
        mark = audit.mark()
        started = time.monotonic()
        progress(f"creating {n} clusters for the operator")
        create_clusters(client, op_ns, n, r)
        created_after = time.monotonic() - started
        if args.probe:
            probe = ProbeChange(client, op_ns, "probe").start()
        wait_all("operator clusters Ready", lambda: ready_clusters(client, op_ns), expected, args.timeout, op)
        elapsed = time.monotonic() - started
        probe_seconds = probe.join(timeout=600) if probe is not None else None
        reqs = audit.requests_since(mark)
        total = sum(v for (verb, _), v in reqs.items() if verb != "watch")
        writes = sum(v for (verb, _), v in reqs.items() if verb in ("create", "update", "patch", "delete"))
        progress(
            f"all Ready after {elapsed:.1f} s; peak RSS {peak_rss_mib(op.pid):.1f} MiB; "
            f"{total / n:.2f} requests per cluster; probe {probe_seconds}"
        )
        time.sleep(3)
        resync_mark = audit.mark()
        passes_before = metrics_of(op)
        time.sleep(args.resync_seconds * 1.1 + 5)
        passes_after = metrics_of(op)
        resync = audit.requests_since(resync_mark)
        reconciles = sum(
            v - passes_before.get(k, 0)
            for k, v in passes_after.items()
            if k.startswith("pg_operator_reconcile_total{")
        )
        result["operator"] = {
            "seconds_to_all_ready": round(elapsed, 1),
            "seconds_creating_clusters": round(created_after, 1),
            "peak_rss_mib": round(peak_rss_mib(op.pid), 1),
            "steady_rss_mib": round(peak_rss_mib(op.pid, "VmRSS"), 1),
            "probe_change_seconds": None if probe_seconds is None else round(probe_seconds, 1),
            "cpu_seconds_total": round(cpu_seconds(op.pid), 1),
            "requests_per_cluster": round(total / n, 2),
            "writes_per_cluster": round(writes / n, 2),
            "requests_by_verb": {f"{v} {res}": c for (v, res), c in sorted(reqs.items()) if v != "watch"},
            "resync_window_seconds": round(args.resync_seconds * 1.1 + 5, 1),
            "resync_reconcile_passes": int(reconciles),
            "resync_requests": sum(v for (verb, _), v in resync.items() if verb != "watch"),
            "resync_writes": sum(
                v for (verb, _), v in resync.items() if verb in ("create", "update", "patch", "delete")
            ),
        }
        op.stop()
        if args.restart:
            result["operator"]["restart"] = measure_restart(args, audit, op_config, work, op_ns, expected)
        progress(f"operator half: {json.dumps(result['operator'])}; clearing its namespace")
        client.delete(Namespace, op_ns)
        wait_until(
            "the operator half's pods to go",
            lambda: not list(client.list(Pod, namespace=op_ns)),
            timeout=args.timeout,
            interval=3,
        )
        delete_volumes(admin, op_ns)


def measure_restart(
    args: argparse.Namespace, audit: Audit, op_config: Path, work: Path, op_ns: str, expected: int
) -> dict[str, Any]:
    """A fresh operator over the converged clusters: how long until every cluster has had a pass (the
    queue empty after at least one pass per cluster), and what it asked of the API server meanwhile —
    a level-triggered operator that lost its memory must find nothing to write."""
    mark = audit.mark()
    started = time.monotonic()
    op = OperatorProcess(
        op_config, work, "bench", "--namespace", op_ns, "--workers", str(args.workers),
        "--resync-seconds", str(args.resync_seconds), "--log-level", "warning",
    ).start()  # fmt: skip
    try:
        op.wait_leader(timeout=args.timeout)  # leading and ready: the cache has synced
        ready_after = time.monotonic() - started

        def passed_all() -> bool:
            metrics = metrics_of(op)
            passes = sum(v for k, v in metrics.items() if k.startswith("pg_operator_reconcile_total{"))
            return passes >= expected and metrics.get("pg_operator_workqueue_depth", 1) == 0

        wait_until(
            "every cluster passed once after the restart", passed_all, timeout=args.timeout, interval=1
        )
        all_passed_after = time.monotonic() - started
        time.sleep(3)
        reqs = audit.requests_since(mark)
        return {
            "seconds_to_leader_and_synced": round(ready_after, 1),
            "seconds_to_every_cluster_passed": round(all_passed_after, 1),
            "peak_rss_mib": round(peak_rss_mib(op.pid), 1),
            "requests": {f"{v} {res}": c for (v, res), c in sorted(reqs.items()) if v != "watch"},
            "writes": sum(c for (v, _), c in reqs.items() if v in ("create", "update", "patch", "delete")),
        }
    finally:
        op.stop()


def run_floor_half(
    args: argparse.Namespace, client: Client, admin: KubeConfig, floor_ns: str, result: dict[str, Any]
) -> None:
    n, r = args.clusters, args.replicas
    if True:
        # --- the floor: the same children, created directly ---------------------------------------
        ensure_namespace(client, floor_ns)
        result["volumes_seconds_floor"] = round(
            prepare_volumes(client, admin, floor_ns, claims_of(cluster_names(n), r), r, args.timeout), 1
        )
        progress(f"floor: creating {n} clusters' children directly")
        started = time.monotonic()
        clusters = create_clusters(client, floor_ns, n, r)
        floor_requests = n + asyncio.run(floor_create(admin, clusters, args.workers))
        wait_all("floor clusters ready", lambda: ready_floor_clusters(client, floor_ns, r), n, args.timeout)
        result["floor"] = {
            "seconds_to_all_ready": round(time.monotonic() - started, 1),
            "requests_per_cluster": round(floor_requests / n, 2),
        }
        if "operator" in result:
            result["ratio_to_floor"] = round(
                result["operator"]["seconds_to_all_ready"] / result["floor"]["seconds_to_all_ready"], 2
            )
        result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]


if __name__ == "__main__":
    sys.exit(main())
