"""Scale benchmark of the reconcile loop on the kwok profile. Prints one JSON line.

N PostgresClusters of R instances each, handled by the operator (subprocess, its own ServiceAccount):
time until all are Ready, the operator's peak RSS, API requests per cluster (audit log, by the operator's
user), and the requests of one steady-state resync of all clusters. Side by side, the floor: the
fastest plain script creating the same objects for N other clusters (the same builders, TLS Secrets
included; every object sent as soon as it can be, every cluster at once, `--floor-in-flight` requests in
flight; nothing of the operator's own concurrency design), waiting for the same readiness as the
operator's Ready condition (every instance ready, and a ready primary: pods are labelled with their role
as Patroni would, by the same stand-in in both halves). `--floor-first` runs the floor half first:
alternate it over runs.

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
meanwhile (a converged cluster needs no write). After the resync window, the cost of one scrape of the
operator's /metrics with every cluster's series in it (wall time, operator CPU, size, samples).

    .venv/bin/python bench/bench_reconcile_scale.py --clusters 50 --probe --restart
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness (it puts the repo root on sys.path for localkube)

from lightkube.resources.core_v1 import Namespace  # noqa: E402
from scale.clusters import RoleLabeller, connect  # noqa: E402
from scale.floor import run_floor_half  # noqa: E402
from scale.operator_half import run_operator_half  # noqa: E402
from scale.volumes import delete_volumes, ensure_storage_class  # noqa: E402

from harness.operator_process import install_operator_identity, operator_kubeconfig  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--workers", type=int, default=16, help="operator --workers and floor concurrency")
    parser.add_argument("--resync-seconds", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--keep", action="store_true", help="leave the floor half's namespace behind")
    parser.add_argument("--probe", action="store_true", help="time one change made during the burst")
    parser.add_argument("--no-floor", action="store_true", help="the operator half only")
    parser.add_argument("--no-operator", action="store_true", help="the floor half only")
    parser.add_argument("--floor-first", action="store_true", help="the floor half before the operator's")
    parser.add_argument(
        "--floor-in-flight",
        type=int,
        default=128,
        help="the floor's requests in flight (the API server's own limit is the real cap)",
    )
    parser.add_argument(
        "--restart", action="store_true", help="then restart the operator over the converged clusters"
    )
    parser.add_argument("--label", default="", help="a name for this run in the JSON line (e.g. a commit)")
    args = parser.parse_args()

    audit, kube, admin, client = connect()
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
    result["order"] = ["floor", "operator"] if args.floor_first else ["operator", "floor"]
    with RoleLabeller(admin):
        # The operator watches only its own namespace, so either half may go first (alternate them
        # over runs: whichever goes second meets an API server and etcd already holding the first's).
        if args.floor_first and not args.no_floor:
            run_floor_half(args, client, admin, floor_ns, result)
        if not args.no_operator:
            run_operator_half(args, client, admin, kube, audit, op_config, work, op_ns, result)
            result["load_average_operator_end"] = [round(x, 2) for x in os.getloadavg()]
        if not args.floor_first and not args.no_floor:
            run_floor_half(args, client, admin, floor_ns, result)
    if "floor" in result and "operator" in result:
        result["ratio_to_floor"] = round(
            result["operator"]["seconds_to_all_ready"] / result["floor"]["seconds_to_all_ready"], 2
        )
    if not args.keep and not args.no_floor:
        client.delete(Namespace, floor_ns)
        delete_volumes(admin, floor_ns)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
