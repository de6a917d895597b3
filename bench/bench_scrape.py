"""The cost of scraping an instance's /metrics, on the full profile: one JSON line.

A one-instance cluster whose metrics port is open to the host; nothing else scrapes it. Per run, 20
scrapes after the once-a-minute database sizes were read (and one that reads them), first with the one
application database, then with 100 more: the client's wall time, the endpoint's own query time and CPU
time, and the CPU time of the endpoint's PostgreSQL session (from the pod's /proc). The sizes query runs
once a minute, so each measurement first waits a minute.

  python3 localkube/cluster.py up full && .venv/bin/python bench/bench_scrape.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from localkube.common import Context  # noqa: E402

from harness.deployed_operator import install_operator  # noqa: E402
from harness.e2e_backup import BRIDGE_HOST  # noqa: E402
from harness.kube import apply_objects  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402
from harness.metrics_scrape import scrape_cost  # noqa: E402
from harness.objects import cluster  # noqa: E402
from harness.pgcluster import secret, wait_serving  # noqa: E402

NS, NAME = "bench-scrape", "scraped-db"
RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}}
SIZES_EVERY_S = 61  # the endpoint reads database sizes at most once a minute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--databases", type=int, default=100)
    args = ap.parse_args()
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    install_operator(kube)
    kube.kubectl("create", "namespace", NS, check=False)
    policy = {"metricsFrom": [{"ipBlock": {"cidr": f"{BRIDGE_HOST}/32"}}]}
    apply_objects(kube, cluster(NAME, NS, replicas=1, resources=RESOURCES, networkPolicy=policy))
    wait_serving(kube, NS, NAME, 1, 900)
    pod = f"{NAME}-0"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        ca = Path(work) / "ca.crt"
        ca.write_text(secret(kube, NS, f"{NAME}-ca")["ca.crt"])
        time.sleep(SIZES_EVERY_S)
        one = scrape_cost(kube, NS, NAME, pod, ca, args.scrapes)
        statements = [a for i in range(args.databases) for a in ("-c", f"CREATE DATABASE scrape_{i}")]
        psql = ("psql", "-h", "/var/run/postgresql", "-U", "postgres", "-qAtX")
        kube.kubectl("exec", "-n", NS, pod, "-c", "postgres", "--", *psql, *statements, timeout=600)
        time.sleep(SIZES_EVERY_S)
        many = scrape_cost(kube, NS, NAME, pod, ca, args.scrapes)
    print(json.dumps({
        "bench": "instance_scrape", "scrapes": args.scrapes, "1_database": one,
        f"{args.databases + 1}_databases": many,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }), flush=True)  # fmt: skip
    kube.kubectl("delete", "namespace", NS, "--ignore-not-found", timeout=600)


if __name__ == "__main__":
    main()
