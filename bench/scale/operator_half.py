"""The operator half of the scale bench: N clusters handled by the operator (a subprocess with its own
ServiceAccount), timed until all are Ready, its RSS and CPU, its API requests per cluster (audit log),
one steady-state resync of all clusters, and with --probe one change made in the middle of the burst."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from lightkube import Client, KubeConfig, codecs
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.types import PatchType

from harness.audit import Audit
from harness.kube import ExternalKube
from harness.objects import cluster
from harness.operator_process import OperatorProcess
from harness.waiting import wait_until
from scale.clusters import (
    PGC,
    STORAGE_CLASS,
    cluster_names,
    create_clusters,
    ensure_namespace,
    ready_clusters,
    statefulset_replicas,
    wait_all,
)
from scale.measure import cpu_seconds, metrics_of, peak_rss_mib, progress, scrape_cost
from scale.restart import measure_restart
from scale.volumes import claims_of, delete_volumes, prepare_volumes


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
                codecs.from_dict(cluster("probe", op_ns, replicas=1, storageClassName=STORAGE_CLASS))
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
        # The metrics endpoint with every cluster's series in it (what a Prometheus scrape costs here).
        result["operator"]["metrics_scrape"] = scrape_cost(op)
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
