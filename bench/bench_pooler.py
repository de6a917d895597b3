"""The pooler against direct connections on the full profile: one JSON line.

A three-instance cluster with `spec.pooler` (two PgBouncer pods, transaction mode). In each trial four
writers of short transactions (one INSERT, autocommit) run side by side: through `-pooler-rw` and
directly through `-rw`, each on a new connection per transaction and on one persistent connection,
all over TLS verified against the cluster's CA (harness/pooler_load.py). Trials alternate a requested
switchover (`switchover-to=auto`) and a SIGKILL of the primary's container; each ends when every
writer has committed again and the cluster is healthy. Per path: failed transactions and the longest
stall (the longest time between two commits) — the outage — summed and maximal over the trials. Before
the trials, the steady-state latency: one client alternating a transaction through a persistent pooler
connection and one through a persistent direct connection, medians and p95 over `--samples` each.
Two more writers in every trial go through the pooler with drivers at their DEFAULT settings, which
prepare statements on the server (psycopg 3 after 5 executions, asyncpg always; harness/pooler_drivers.py):
failed transactions, stalls and acknowledged writes missing from the new primary afterwards (`lost`).
Before the trials, the throughput through the pooler with prepared statements on and off: `--clients`
clients of one driver setting at a time, back to back, for `--throughput-seconds` each; printed as a
JSON line of its own (`"bench": "pooler_throughput"`).
The machine is shared: the JSON carries the load average before and after.

  python3 localkube/cluster.py up full && .venv/bin/python bench/bench_pooler.py --switchovers 3 --kills 3
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

import psycopg  # noqa: E402
from localkube.common import Context  # noqa: E402

from harness.deployed_operator import install_operator  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402
from harness.pgcluster import healthy, kill_container, status  # noqa: E402
from harness.pooler_drivers import DriverWriter, missing_rows  # noqa: E402
from harness.pooler_load import Endpoint, TxWriter, endpoint  # noqa: E402
from harness.waiting import wait_until  # noqa: E402

NS, NAME = "bench-pooler", "bench-db"
SMALL = {"requests": {"cpu": "100m", "memory": "512Mi"}}
POOLER = {"instances": 2, "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}}}
PATHS = ("pooler_new_connection", "pooler_persistent", "direct_new_connection", "direct_persistent",
         "pooler_psycopg_default", "pooler_asyncpg_default")  # fmt: skip
# Throughput settings: (name, driver, prepared statements on).
THROUGHPUT = (("psycopg_default", "psycopg", True), ("psycopg_unprepared", "psycopg", False),
              ("asyncpg_default", "asyncpg", True))  # fmt: skip


def pooler_pointing_at(kube: Kube, primary: str) -> bool:
    cond = next((c for c in status(kube, NS, NAME).get("conditions") or () if c["type"] == "Pooler"), {})
    return cond.get("status") == "True" and f"{primary}.{NAME}.{NS}.svc" in cond.get("message", "")


def steady_latency(pooler: Endpoint, direct: Endpoint, samples: int) -> dict[str, float]:
    """One client, alternating: the same load on both paths at the same moments."""
    took: dict[str, list[float]] = {"pooler": [], "direct": []}
    with psycopg.connect(**pooler.dsn(), autocommit=True, prepare_threshold=None) as p, \
            psycopg.connect(**direct.dsn(), autocommit=True) as d:  # fmt: skip
        for conn in (p, d):
            conn.execute("create table if not exists bench_latency (id bigserial primary key, v int)")
        for _ in range(samples):
            for name, conn in (("pooler", p), ("direct", d)):
                started = time.perf_counter()
                conn.execute("insert into bench_latency (v) values (1)")
                took[name].append(time.perf_counter() - started)
    out: dict[str, float] = {}
    for name, values in took.items():
        values.sort()
        out[f"steady_{name}_median_ms"] = round(statistics.median(values) * 1000, 2)
        out[f"steady_{name}_p95_ms"] = round(values[int(len(values) * 0.95) - 1] * 1000, 2)
    overhead = out["steady_pooler_median_ms"] - out["steady_direct_median_ms"]
    out["steady_overhead_median_ms"] = round(overhead, 2)
    return out


def throughput(pooler: Endpoint, clients: int, seconds: float) -> dict[str, Any]:
    """Transactions per second through the pooler, one driver setting at a time (closed loop, no pause)."""
    out: dict[str, Any] = {"bench": "pooler_throughput", "clients": clients, "seconds": seconds}
    for name, driver, prepare in THROUGHPUT:
        writers = [DriverWriter(driver, pooler, f"tp_{name}_{c}", pause_s=0, prepare=prepare)
                   for c in range(clients)]  # fmt: skip
        for w in writers:
            w.start()
        try:
            for w in writers:
                if not w.wait_for(10, 60):
                    raise AssertionError(f"no steady writes for {name}: {w.summary()}")
            counted = sum(len(w.acked) for w in writers)
            started = time.monotonic()
            time.sleep(seconds)
            done = sum(len(w.acked) for w in writers) - counted
            took = time.monotonic() - started
        finally:
            for w in writers:
                w.stop()
        out[f"{name}_tps"] = round(done / took, 1)
        out[f"{name}_failed"] = sum(w.failures for w in writers)
    return out


def trial(kube: Kube, how: str, i: int, pooler: Endpoint, direct: Endpoint) -> dict[str, Any]:
    st = wait_until("a healthy cluster", lambda: healthy(kube, NS, NAME, 3), 600, 1)
    old = st["currentPrimary"]
    wait_until("the pooler pointed at the primary", lambda: pooler_pointing_at(kube, old), 120, 0.5)
    writers: dict[str, TxWriter | DriverWriter] = {
        "pooler_new_connection": TxWriter(pooler, f"t{i}_pn", persistent=False),
        "pooler_persistent": TxWriter(pooler, f"t{i}_pp", persistent=True),
        "direct_new_connection": TxWriter(direct, f"t{i}_dn", persistent=False),
        "direct_persistent": TxWriter(direct, f"t{i}_dp", persistent=True),
        "pooler_psycopg_default": DriverWriter("psycopg", pooler, f"t{i}_ps"),
        "pooler_asyncpg_default": DriverWriter("asyncpg", pooler, f"t{i}_pa"),
    }
    for w in writers.values():
        w.start()
    try:
        for w in writers.values():
            if not w.wait_for(10, 60):
                raise AssertionError(f"no steady writes before trial {i}: {w.summary()}")
            w.reset()
        if how == "switchover":
            kube.kubectl(
                "annotate", "pgc", NAME, "-n", NS, "db.example.com/switchover-to=auto", "--overwrite"
            )
        else:
            kill_container(kube, NS, old)
        new = wait_until("a new primary", lambda: (s := status(kube, NS, NAME)).get("currentPrimary")
                         not in (None, "", old) and s["currentPrimary"], 300, 0.2)  # fmt: skip
        for w in writers.values():
            if not w.wait_for(10, 120):
                raise AssertionError(f"writes did not resume after trial {i}: {w.summary()}")
    finally:
        for w in writers.values():
            w.stop()
    row: dict[str, Any] = {"kind": how, "old": old, "new": new}
    for path, w in writers.items():
        row[path] = {"failed": w.failures, "stall_s": round(w.stall, 2)}
        if isinstance(w, DriverWriter):
            row[path]["lost"] = len(missing_rows(direct, w.table, w.acked))
            row[path]["errors"] = w.errors[:2]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--switchovers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300, help="steady-state transactions per path")
    parser.add_argument("--clients", type=int, default=4, help="clients per throughput setting")
    parser.add_argument("--throughput-seconds", type=float, default=15.0)
    parser.add_argument(
        "--installed", action="store_true", help="use the images and the operator already in the cluster"
    )
    args = parser.parse_args()
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    if not args.installed:
        install_operator(kube)
    kube.kubectl("create", "namespace", NS, check=False)
    body = {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"replicas": 3, "version": "16", "storage": "1Gi", "resources": SMALL, "pooler": POOLER},
    }
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    wait_until("the cluster to be healthy", lambda: healthy(kube, NS, NAME, 3), 900, 1)
    primary = status(kube, NS, NAME)["currentPrimary"]
    wait_until("the pooler pointed at the primary", lambda: pooler_pointing_at(kube, primary), 300, 1)
    pooler = endpoint(kube, NS, NAME, f"{NAME}-pooler-rw")
    direct = endpoint(kube, NS, NAME, f"{NAME}-rw")
    load_before = os.getloadavg()
    out: dict[str, Any] = {"bench": "pooler"}
    rows: list[dict[str, Any]] = []
    try:
        out.update(steady_latency(pooler, direct, args.samples))
        tp = throughput(pooler, args.clients, args.throughput_seconds)
        tp["load_avg_1m"] = round(os.getloadavg()[0], 2)
        print(json.dumps(tp), flush=True)
        kinds = ["switchover"] * args.switchovers + ["kill"] * args.kills
        # Alternate the kinds so neither runs all on a warmer or a colder cluster.
        order = [k for pair in zip(kinds[: args.switchovers], kinds[args.switchovers:], strict=False)
                 for k in pair] + kinds[2 * min(args.switchovers, args.kills):]  # fmt: skip
        for i, how in enumerate(order):
            rows.append(trial(kube, how, i, pooler, direct))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        final = status(kube, NS, NAME)
        kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    for how in ("switchover", "kill"):
        mine = [r for r in rows if r["kind"] == how]
        out[f"{how}_trials"] = len(mine)
        for path in PATHS:
            if mine:
                out[f"{how}_{path}_failed"] = sum(r[path]["failed"] for r in mine)
                out[f"{how}_{path}_stall_max_s"] = max(r[path]["stall_s"] for r in mine)
                stalls = [r[path]["stall_s"] for r in mine]
                out[f"{how}_{path}_stall_p50_s"] = round(statistics.median(stalls), 2)
                if "lost" in mine[0][path]:
                    out[f"{how}_{path}_lost"] = sum(r[path]["lost"] for r in mine)
    out["final_phase"] = final.get("phase")
    out["load_avg_1m_before"] = round(load_before[0], 2)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
