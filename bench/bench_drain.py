"""A node drain of the primary's node on the full profile with three nodes, measured over trials: one JSON
line (docs/high-availability.md#drains).

Each trial: two writers in pods on a node that is not drained (bench/tests' harness/pod_writer.py: the host
reaches no Service address on a multi-node profile), each one INSERT per new connection, one through
`<name>-pooler-rw`, one straight to `<name>-rw`; then `kubectl drain` of the primary's node (the primary's
budget holds the eviction until the operator has switched over), then `kubectl uncordon` and a wait until
the cluster is 3/3 Ready with the pooler on the new primary. Figures per trial: how long the drain took
(the command's wall time), how long until the primary had moved (from the drain's start), and for each
writer the failed transactions and its longest stall (the longest time between two acknowledged
commits). The machine is shared: the JSON carries the load average before and after each trial.

Also `bench_failover.py --kinds drain`, which runs this (its own cluster: a pooler, required spread, writers
in pods) rather than bench_failover's host writers, which reach the `-rw` ClusterIP only with one node.

  PGOP_FULL_NODES=3 python3 localkube/cluster.py up full && .venv/bin/python bench/bench_drain.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from localkube import topology  # noqa: E402
from localkube.common import Context  # noqa: E402

from harness.deployed_operator import E2E_OPERATOR_ARGS, install_operator  # noqa: E402
from harness.kube import get_json  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402
from harness.objects import cluster  # noqa: E402
from harness.pgcluster import healthy, status  # noqa: E402
from harness.pod_writer import PodWriter, writer_pod  # noqa: E402
from harness.waiting import wait_until  # noqa: E402

NS, NAME = "bench-drain", "bench-db"
SPEC: dict[str, Any] = {
    "replicas": 3,
    "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}},
    "pooler": {"instances": 2, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}},
}


def primary_node(kube: Kube) -> tuple[str, str]:
    primary = str(status(kube, NS, NAME)["currentPrimary"])
    return primary, str(get_json(kube, "pod", primary, "-n", NS)["spec"]["nodeName"])


def pooler_on(kube: Kube, primary: str) -> bool:
    cond = next((c for c in status(kube, NS, NAME).get("conditions") or () if c["type"] == "Pooler"), {})
    return cond.get("status") == "True" and f"{primary}.{NAME}.{NS}.svc" in cond.get("message", "")


def serving(kube: Kube) -> str:
    st = wait_until("3/3 Ready", lambda: healthy(kube, NS, NAME, 3), 900, 2)
    primary = str(st["currentPrimary"])
    wait_until("the pooler on the primary", lambda: pooler_on(kube, primary), 300, 1)
    return primary


def trial(kube: Kube, n: int) -> dict[str, Any]:
    serving(kube)
    old, drained = primary_node(kube)
    nodes = sorted(node["metadata"]["name"] for node in get_json(kube, "nodes")["items"])
    elsewhere = next(node for node in nodes if node != drained)
    writers = {
        "pooled": PodWriter(
            kube, writer_pod(f"pooled-{n}", NS, NAME, f"{NAME}-pooler-rw", elsewhere, f"pooled_{n}")
        ),
        "direct": PodWriter(
            kube, writer_pod(f"direct-{n}", NS, NAME, f"{NAME}-rw", elsewhere, f"direct_{n}")
        ),
    }
    load_before = os.getloadavg()[0]
    for w in writers.values():
        w.start()
    for w in writers.values():
        w.wait_for(50, 120)
    started = time.monotonic()
    drain = subprocess.Popen(
        [str(kube.ctx.bin / "kubectl"), "--kubeconfig", kube.kubeconfig, "drain", drained,
         "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=600s"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    moved = wait_until("the primary to move", lambda: primary_node(kube)[0] != old, 600, 0.2)
    moved_s = time.monotonic() - started if moved else None
    out, _ = drain.communicate(timeout=660)
    drain_s = time.monotonic() - started
    if drain.returncode != 0:
        raise AssertionError(f"drain of {drained} failed:\n{out[-2000:]}")
    for w in writers.values():
        w.wait_for(20, 120)
    summaries = {label: w.stop() for label, w in writers.items()}
    kube.kubectl("uncordon", drained)
    serving(kube)
    return {
        "node": drained,
        "drain_s": round(drain_s, 2),
        "switched_s": round(moved_s or 0, 2),
        "load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **{k: {"failed": s.failed, "stall_s": round(s.stall, 2)} for k, s in summaries.items()},
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    if len(topology.load_layout(Context())) < 3:
        parser.error(NEEDS_NODES)
    print(json.dumps(run(args.trials)))
    return 0


NEEDS_NODES = (
    "needs the full profile with three nodes: PGOP_FULL_NODES=3 python3 localkube/cluster.py up full"
)


def run(trials: int) -> dict[str, Any]:
    """`trials` drains on a cluster of its own, installed and deleted here: the bench's JSON line."""
    ctx = Context()
    kube = Kube("full", str(ctx.admin_kubeconfig), ctx)
    install_operator(kube, E2E_OPERATOR_ARGS)
    kube.kubectl("create", "namespace", NS, check=False)
    kube.kubectl("apply", "-f", "-", input=json.dumps(cluster(NAME, NS, **SPEC)))
    rows = []
    try:
        for n in range(trials):
            rows.append(trial(kube, n))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    return {
        "bench": "drain",
        "kind": "drain",
        "trials": len(rows),
        "drain_s": spread([r["drain_s"] for r in rows]),
        "switched_s": spread([r["switched_s"] for r in rows]),
        **{
            w: {
                "failed": sum(r[w]["failed"] for r in rows),
                "stall_s": spread([r[w]["stall_s"] for r in rows]),
            }
            for w in ("pooled", "direct")
        },
        "rows": rows,
    }


if __name__ == "__main__":
    sys.exit(main())
