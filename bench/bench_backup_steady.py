"""The operator's steady state with `spec.backup` at scale (issue #17), on the kwok profile. Prints one JSON
line.

N PostgresClusters with continuous archiving to a real S3 server (moto, authentication on, on loopback:
the operator's own ownership checks reach it), handled by the operator (a subprocess with its own
ServiceAccount). Once every cluster is Ready, the bench counts over a window what the operator asks
of the API server (audit log, by the operator's user), of the S3 server (moto's request log), how many
passes it made and the CPU it used.

Two modes, in the same run, in the order given:
- `report`: each primary carries the archiving report its instance publishes (backup.archive_report)
  with the gate open, as a real instance's does once the operator wrote the gate. kwok runs no process,
  so the bench writes that annotation in the instance's place, once per primary; what is measured is
  the operator's side.
- `exec`: no report, as with instances of an image from before the report: the operator asks each
  primary itself (pod exec) every 30 s. kwok's pods cannot be exec'd into, so each failed probe is also
  followed by a store listing exec (a real primary answers the probe and needs none): in this mode the
  exec count is twice what real pods would get.

    .venv/bin/python bench/bench_backup_steady.py --clusters 1000 --modes report,exec
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(REPO / "tests"))  # the test harness (it puts the repo root on sys.path for localkube)

from lightkube import Client, KubeConfig, codecs  # noqa: E402
from lightkube.core.exceptions import ApiError  # noqa: E402
from lightkube.resources.core_v1 import Namespace, Pod  # noqa: E402
from lightkube.types import PatchType  # noqa: E402
from scale.clusters import (  # noqa: E402
    STORAGE_CLASS,
    RoleLabeller,
    cluster_names,
    clusters_with,
    connect,
    ensure_namespace,
    ready_clusters,
    wait_all,
)
from scale.measure import cpu_seconds, metrics_of, peak_rss_mib, progress  # noqa: E402
from scale.volumes import claims_of, delete_volumes, ensure_storage_class, prepare_volumes  # noqa: E402

from harness.audit import Audit  # noqa: E402
from harness.objects import cluster, s3_credentials_secret  # noqa: E402
from harness.operator_process import (  # noqa: E402
    OperatorProcess,
    install_operator_identity,
    operator_kubeconfig,
)
from harness.s3 import S3Server, s3_server  # noqa: E402
from harness.waiting import wait_until  # noqa: E402
from pg_operator.backup.archive_gate import gate_line  # noqa: E402
from pg_operator.backup.archive_health import ArchiverStats  # noqa: E402
from pg_operator.backup.archive_report import ArchiveReport, annotation_patch  # noqa: E402
from pg_operator.backup.catalog import parse_time  # noqa: E402
from pg_operator.controller.backup_reconcilers.shared import backup_config, store_of  # noqa: E402

BUCKET = "bench"


def secret_name(cluster_name: str) -> str:
    """Each cluster's own credentials Secret: the operator takes backup credentials only from a Secret
    labelled for the cluster that names it."""
    return f"{cluster_name}-s3"


def bodies(ns: str, names: list[str], replicas: int, endpoint: str) -> list[dict[str, Any]]:
    def backup(name: str) -> dict[str, Any]:
        return {"s3": {"endpointURL": endpoint, "bucket": BUCKET, "path": "steady",
                       "credentials": {"secretName": secret_name(name)}}}  # fmt: skip

    return [cluster(name, ns, replicas=replicas, storageClassName=STORAGE_CLASS, backup=backup(name),
                    resources={"requests": {"cpu": "10m", "memory": "128Mi"}})
            for name in names]  # fmt: skip


def report_for(body: dict[str, Any]) -> dict[str, Any]:
    """The annotation patch a healthy primary publishes once its gate is open."""
    config = backup_config(body)
    assert config is not None
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    stats = ArchiverStats(archived_count=3, last_archived_wal="000000010000000000000003",
                          last_archived_time=parse_time(now), failed_count=0, last_failed_wal="",
                          last_failed_time=None, pending=0)  # fmt: skip
    return annotation_patch(ArchiveReport(gate_line("archive", store_of(body, config)), stats))


class ReportStandIn:
    """Publishes each primary's report once, as its instance would (kwok runs no instance)."""

    def __init__(self, config: KubeConfig, ns: str, by_name: dict[str, dict[str, Any]]) -> None:
        self.client = Client(config, field_manager="bench-instance-stand-in")
        self.ns, self.by_name = ns, by_name
        self.done: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReportStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _publish(self, pod: str, cluster_name: str) -> None:
        try:
            self.client.patch(Pod, pod, report_for(self.by_name[cluster_name]), namespace=self.ns,
                              patch_type=PatchType.MERGE)  # fmt: skip
            self.done.add(cluster_name)
        except ApiError:
            pass

    def _run(self) -> None:
        with ThreadPoolExecutor(4) as pool:
            while not self._stop.is_set() and len(self.done) < len(self.by_name):
                for pod in self.client.list(Pod, namespace=self.ns, labels={"role": "primary"}):
                    name = pod.metadata.name if pod.metadata else None
                    cluster_name = ((pod.metadata.labels or {}) if pod.metadata else {}).get(
                        "db.example.com/cluster"
                    )
                    if name and cluster_name in self.by_name and cluster_name not in self.done:
                        pool.submit(self._publish, name, cluster_name)
                time.sleep(3)


def moto_lines(log: Path) -> int:
    with log.open("rb") as f:
        return sum(1 for line in f if b'HTTP/1.1"' in line)


def one_mode(mode: str, args: argparse.Namespace, client: Client, admin: KubeConfig, audit: Audit,
             op_config: Path, work: Path, s3: S3Server) -> dict[str, Any]:  # fmt: skip
    n, r = args.clusters, args.replicas
    ns = f"bench-steady-{mode}-{time.strftime('%H%M%S')}"
    ensure_namespace(client, ns)
    names = cluster_names(n)
    for name in names:
        secret = s3_credentials_secret(
            secret_name(name), ns, s3.access_key_id, s3.secret_access_key, cluster=name
        )
        client.create(codecs.from_dict(secret))
    prepare_volumes(client, admin, ns, claims_of(names, r), r, args.timeout)
    op = OperatorProcess(op_config, work, f"steady-{mode}", "--namespace", ns, "--workers", str(args.workers),
                         "--lease-duration", str(args.lease_duration),
                         "--log-level", "warning").start()  # fmt: skip
    op.wait_leader(timeout=120)
    all_bodies = bodies(ns, names, r, s3.endpoint)
    by_name = {b["metadata"]["name"]: b for b in all_bodies}
    started = time.monotonic()
    progress(f"{mode}: creating {n} clusters with spec.backup")
    stand_in = ReportStandIn(admin, ns, by_name) if mode == "report" else None
    if stand_in is not None:
        stand_in.__enter__()
    try:
        with ThreadPoolExecutor(16) as pool:  # the creates are not what is measured
            list(pool.map(lambda body: client.create(codecs.from_dict(body)), all_bodies))
        wait_all(f"{mode}: clusters Ready", lambda: ready_clusters(client, ns), n, args.timeout, op)
        if mode == "report":
            archiving = lambda: clusters_with(client, ns, "ContinuousArchiving")  # noqa: E731
            wait_all("report: ContinuousArchiving True", archiving, n, args.timeout, op)
    finally:
        if stand_in is not None:
            stand_in.__exit__()
    converged = time.monotonic() - started
    time.sleep(args.settle)
    mark = audit.mark()
    s3_before, cpu_before, passes_before = moto_lines(s3.log), cpu_seconds(op.pid), metrics_of(op)
    time.sleep(args.window)
    requests = audit.requests_since(mark, namespace=ns)
    s3_after, cpu_after, passes_after = moto_lines(s3.log), cpu_seconds(op.pid), metrics_of(op)
    passes = sum(v - passes_before.get(k, 0) for k, v in passes_after.items()
                 if k.startswith("pg_operator_reconcile_total{"))  # fmt: skip
    total = sum(v for (verb, _), v in requests.items() if verb != "watch")
    out = {
        "seconds_to_converged": round(converged, 1),
        "window_seconds": args.window,
        "api_requests": total,
        "api_requests_per_second": round(total / args.window, 2),
        "api_requests_per_cluster_per_hour": round(total / n * 3600 / args.window, 2),
        "requests_by_verb": {f"{v} {res}": c for (v, res), c in sorted(requests.items()) if v != "watch"},
        "s3_requests": s3_after - s3_before,
        "reconcile_passes": int(passes),
        "operator_cpu_seconds": round(cpu_after - cpu_before, 2),
        "peak_rss_mib": round(peak_rss_mib(op.pid), 1),
    }
    progress(f"{mode}: {json.dumps(out)}")
    op.stop()
    client.delete(Namespace, ns)
    wait_until(f"{ns}'s pods to go", lambda: not list(client.list(Pod, namespace=ns)), timeout=args.timeout,
               interval=3)  # fmt: skip
    delete_volumes(admin, ns)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument(
        "--replicas", type=int, default=1, help="instances per cluster (only the primary archives)"
    )
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--modes", default="report,exec", help="report and/or exec, in this order")
    parser.add_argument(
        "--settle", type=float, default=30.0, help="seconds after convergence before the window"
    )
    parser.add_argument("--window", type=float, default=120.0, help="seconds counted")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--lease-duration", type=int, default=15, help="the operator's lease, 2 to 15 s")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    audit, kube, admin, client = connect()
    result: dict[str, Any] = {
        "bench": "backup_steady", "clusters": args.clusters, "replicas": args.replicas, "label": args.label,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }  # fmt: skip
    install_operator_identity(kube)
    work = Path(tempfile.mkdtemp(prefix="bench-steady-"))
    op_config = operator_kubeconfig(kube, work / "operator.kubeconfig")
    ensure_storage_class(client)
    with s3_server(work) as s3, RoleLabeller(admin):
        s3.client().create_bucket(Bucket=BUCKET)
        for mode in args.modes.split(","):
            result[mode] = one_mode(mode, args, client, admin, audit, op_config, work, s3)
            result[f"load_average_after_{mode}"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
