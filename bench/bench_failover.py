"""Failover and switchover on the full profile, measured over trials: one JSON line of medians.

For each trial, a writer inserts through <name>-rw (a new connection per attempt, as a pooled client
reconnects) while the primary is (a) SIGKILLed at its container's init process, (b) deleted as a pod,
(c) switched over on request, (d) SIGKILLed with the operator scaled to zero (Patroni alone, with the
dynamic settings the operator left it), (e) cut off the network inside its pod's netns (iptables DROP,
healed once writes have resumed on the new primary: Patroni's ttl bounds this one). The figure is the
longest stretch without a successful write.
The cluster uses synchronous replication, and every acknowledged write is checked after each trial.
The machine is shared: the JSON carries the load average before and after.

  python3 localkube/cluster.py up full && .venv/bin/python bench/bench_failover.py --trials 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from localkube.common import Context  # noqa: E402

from harness.deployed_operator import OPERATOR_NAMESPACE, install_operator  # noqa: E402
from harness.kube import get_json  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402
from harness.pgcluster import Partition, Writer, healthy, kill_container, pod_netns, status  # noqa: E402
from harness.waiting import wait_until  # noqa: E402

NS, NAME = "bench-failover", "bench-db"
KINDS = ("sigkill", "pod_delete", "switchover", "sigkill_patroni_only", "partition")
SMALL = {"requests": {"cpu": "100m", "memory": "512Mi"}}


def scale_operator(kube: Kube, replicas: int) -> None:
    kube.kubectl("-n", OPERATOR_NAMESPACE, "scale", "deployment/pg-operator", f"--replicas={replicas}")
    if replicas:
        kube.kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pg-operator",
                     "--timeout=300s", timeout=320)
    else:
        wait_until("the operator to stop", lambda: not kube.kubectl(
            "-n", OPERATOR_NAMESPACE, "get", "pods", "-o", "name").stdout.strip(), 120, 1)


def trial(kube: Kube, how: str, table: str) -> dict[str, Any]:
    if how == "sigkill_patroni_only":
        try:
            return _trial(kube, how, table, scale_down=True)
        finally:
            scale_operator(kube, 1)
    return _trial(kube, how, table)


def _trial(kube: Kube, how: str, table: str, scale_down: bool = False) -> dict[str, Any]:
    def steady() -> dict[str, Any] | None:
        """Healthy as the operator reports it, and Patroni agrees: its leader key names the same
        primary and it has recorded a synchronous standby for it (until then strict synchronous mode
        promotes nobody, right after bootstrap or a failover)."""
        st = healthy(kube, NS, NAME, 3)
        sync = get_json(kube, "configmap", f"{NAME}-sync", "-n", NS)["metadata"].get("annotations") or {}
        leader = get_json(kube, "configmap", f"{NAME}-leader", "-n", NS)["metadata"].get("annotations") or {}
        primary = (st or {}).get("currentPrimary")
        ok = primary and leader.get("leader") == primary == sync.get("leader") and sync.get("sync_standby")
        return st if ok else None

    st = wait_until("a steady cluster", steady, 600, 1)
    old = st["currentPrimary"]
    if scale_down:
        scale_operator(kube, 0)
    partition = Partition(pod_netns(kube, NS, old)) if how == "partition" else None
    with Writer(kube, NS, NAME, table) as writer:
        writer.wait_for_writes(20, 60)
        if partition is not None:
            partition.cut()
        elif how in ("sigkill", "sigkill_patroni_only"):
            kill_container(kube, NS, old)
        elif how == "pod_delete":
            kube.kubectl("delete", "pod", old, "-n", NS, "--wait=false")
        else:
            # auto: the operator picks the synchronous standby (Patroni refuses any other replica).
            kube.kubectl("annotate", "pgc", NAME, "-n", NS, "db.example.com/switchover-to=auto",
                         "--overwrite")
        if how == "switchover":
            # Done or refused, the operator answers by clearing the request; a handover may be gapless.
            wait_until("the switchover request to be answered", lambda: writer.outages or (
                "db.example.com/switchover-to" not in (get_json(kube, "pgc", NAME, "-n", NS)["metadata"].get(
                    "annotations") or {})), 300, 0.2)
        else:
            try:
                wait_until("the outage to end", lambda: writer.outages, 300, 0.1)
            finally:
                if partition is not None:
                    partition.heal()
        writer.wait_for_writes(10, 60)
    lost = writer.missing()
    if scale_down:
        # Without the operator nobody writes the status: ask Patroni's leader key who won.
        new = wait_until("a leader", lambda: get_json(kube, "configmap", f"{NAME}-leader", "-n", NS)[
            "metadata"].get("annotations", {}).get("leader"), 300, 1)
    else:
        new = wait_until("healthy again", lambda: healthy(kube, NS, NAME, 3), 600, 1)["currentPrimary"]
    return {"outage_s": writer.longest_outage, "lost": len(lost), "promoted": new != old}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated scenarios to run, of {','.join(KINDS)} (default: all)")
    parser.add_argument("--installed", action="store_true",
                        help="use the images and the operator already in the cluster (no rebuild when src/ "
                             "changed since)")
    args = parser.parse_args()
    unknown = sorted(set(args.kinds.split(",")) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)} (choose from {', '.join(KINDS)})")
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    if not args.installed:
        install_operator(kube)
    kube.kubectl("create", "namespace", NS, check=False)
    body = {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": NAME, "namespace": NS},
            "spec": {"replicas": 3, "version": "16", "storage": "1Gi", "resources": SMALL,
                     "synchronous": {"number": 1, "dataDurability": "required"}}}
    started = time.monotonic()
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    wait_until("the cluster to be healthy", lambda: healthy(kube, NS, NAME, 3), 900, 1)
    ready_s = time.monotonic() - started
    load_before = os.getloadavg()
    kinds = tuple(args.kinds.split(","))
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    try:
        for i in range(args.trials):
            for how, rows in results.items():
                rows.append(trial(kube, how, f"{how}_{i}"))
                print(f"{how} #{i + 1}: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        final = status(kube, NS, NAME)
        kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    out: dict[str, Any] = {"bench": "failover", "trials": args.trials, "apply_to_ready_s": round(ready_s, 1)}
    for how, rows in results.items():
        out[f"{how}_outage_p50_s"] = round(statistics.median(r["outage_s"] for r in rows), 2)
        out[f"{how}_outage_max_s"] = round(max(r["outage_s"] for r in rows), 2)
        out[f"{how}_promoted"] = sum(r["promoted"] for r in rows)
    out["acknowledged_writes_lost"] = sum(r["lost"] for rows in results.values() for r in rows)
    out["final_phase"] = final.get("phase")
    out["load_avg_1m_before"] = round(load_before[0], 2)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
