"""In-place major upgrade next to dump-and-restore of the same data, on the full profile: one JSON line.

Per run, a 3-instance cluster on PostgreSQL 16 gets ~1 GiB (pgbench tables, generated server-side, as
the application's role) and a writer on a persistent connection through <name>-rw. The two ways to
reach 17, in alternating order over the runs:

- in_place: `spec.version` raised to 17 (the operator's check, pg_upgrade --link, restart, re-clone):
  the write outage is the writer's longest stretch without an acknowledged write; replicas_back_s is
  from the first write on 17 until every replica follows; rows_lost counts acknowledged rows missing;
- dump_restore: `pg_dump -Fc` of the application database from the 16 cluster and `pg_restore -j 2` into
  a new, already serving 17 cluster (PostgreSQL 17.11's client tools on this host): the time from the
  dump's start to the restore's end, which is the write outage an application sees if it stops writing
  for the copy to be exact.

  python3 localkube/cluster.py up full && .venv/bin/python bench/bench_major_upgrade.py --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from localkube.common import Context  # noqa: E402
from localkube.images.containerd import ensure_images  # noqa: E402

from harness.binaries import postgresql_binaries  # noqa: E402
from harness.deployed_operator import install_operator  # noqa: E402
from harness.kube import apply_objects, get_json  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402
from harness.local_postgres import RUNTIME  # noqa: E402
from harness.objects import cluster  # noqa: E402
from harness.pgcluster import Writer, secret, service_ip, wait_serving  # noqa: E402
from harness.waiting import wait_until  # noqa: E402
from pg_operator.images import default_image  # noqa: E402

NS = "bench-major"
ANNOTATION = "db.example.com/major-upgrade"
RESOURCES = {"requests": {"cpu": "100m", "memory": "512Mi"}}


def uri(kube: Kube, name: str) -> str:
    app = secret(kube, NS, f"{name}-app")
    return (f"host={service_ip(kube, NS, f'{name}-rw')} port={app['port']} user={app['username']} "
            f"password={app['password']} dbname={app['dbname']} sslmode=require")  # fmt: skip


def client(pg17: Path, tool: str, *args: str, timeout: float = 3600) -> float:
    started = time.monotonic()
    env = {"PATH": f"{pg17 / 'bin'}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(pg17 / "lib")}
    subprocess.run([str(pg17 / "bin" / tool), *args], check=True, env=env, timeout=timeout,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return time.monotonic() - started


def create(kube: Kube, name: str, version: str, replicas: int, storage: str) -> None:
    apply_objects(kube, cluster(name, NS, replicas=replicas, version=version, storage=storage,
                                resources=RESOURCES))  # fmt: skip
    wait_serving(kube, NS, name, replicas, 1200)


def state(kube: Kube, name: str) -> dict[str, Any]:
    raw = (get_json(kube, "pgc", name, "-n", NS)["metadata"].get("annotations") or {}).get(ANNOTATION)
    return dict(json.loads(raw)) if raw else {}


def in_place(kube: Kube, name: str) -> dict[str, Any]:
    with Writer(kube, NS, name, "bench_writes", persistent=True) as writer:
        writer.wait_for_writes(20, 60)
        kube.kubectl("patch", "pgc", name, "-n", NS, "--type=merge", "-p", '{"spec":{"version":"17"}}')
        done = wait_until("the upgrade to finish", lambda: state(kube, name).get("phase") == "Done" and
                          state(kube, name), 3600, 3)  # fmt: skip
        writer.wait_for_writes(20, 120)
    return {"write_outage_s": round(writer.longest_outage, 2), "operator_outage_s": done.get("outage"),
            "replicas_back_s": round(done["replicasBack"] - done["writable"], 1),
            "total_s": round(done["finished"] - done["started"], 1), "rows_lost": len(writer.missing()),
            "acknowledged": len(writer.acked), "replicas": done.get("replicas"),
            "seed_s": done.get("seedSeconds"), "seed_bytes": done.get("seedBytes")}  # fmt: skip


def dump_restore(kube: Kube, pg17: Path, source: str, target: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        dump = str(Path(work) / "app.dump")
        dump_s = client(pg17, "pg_dump", "-Fc", "-Z", "1", "-f", dump, uri(kube, source))
        restore_s = client(pg17, "pg_restore", "-j", "2", "--no-owner", "-d", uri(kube, target), dump)
        size = os.path.getsize(dump)
    return {"write_outage_s": round(dump_s + restore_s, 1), "dump_s": round(dump_s, 1),
            "restore_s": round(restore_s, 1), "dump_bytes": size}  # fmt: skip


def one_run(kube: Kube, pg17: Path, run: int, scale: int, storage: str) -> dict[str, Any]:
    src, dst = f"up{run}-db", f"dr{run}-db"
    create(kube, src, "16", 3, storage)
    create(kube, dst, "17", 1, storage)
    loaded = client(pg17, "pgbench", "-i", "-I", "dtGvp", "-s", str(scale), "-q", uri(kube, src))
    # Alternating, dump first on the first run. When the upgrade goes first the dump reads the same data
    # from the upgraded cluster (recorded as dump_source_major): the copy's cost is the data's, not the
    # major's.
    order = ("in_place", "dump_restore") if run % 2 else ("dump_restore", "in_place")
    out: dict[str, Any] = {"run": run, "order": list(order), "load_s": round(loaded, 1)}
    for how in order:
        if how == "dump_restore":
            out[how] = {
                **dump_restore(kube, pg17, src, dst),
                "dump_source_major": "17" if "in_place" in out else "16",
            }
        else:
            out[how] = in_place(kube, src)
    for name in (src, dst):
        kube.kubectl("delete", "pgc", name, "-n", NS, "--wait=true", timeout=600)
        # The operator keeps a deleted cluster's claims (data safety): at 10 GiB two runs' volumes do not
        # fit beside each other, so the bench removes them and waits until their volumes are gone.
        kube.kubectl("delete", "pvc", "-n", NS, "-l", f"db.example.com/cluster={name}", "--wait=true",
                     timeout=600)  # fmt: skip
    wait_until("the runs' volumes to be removed", lambda: not [
        pv for pv in get_json(kube, "pv")["items"]
        if (pv["spec"].get("claimRef") or {}).get("namespace") == NS], 600, 2)  # fmt: skip
    print(json.dumps(out), file=sys.stderr, flush=True)  # each run as it ends: a long bench keeps its runs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--scale", type=int, default=68, help="pgbench scale (68 ≈ 1 GiB)")
    ap.add_argument("--storage", default="4Gi")
    args = ap.parse_args()
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    install_operator(kube)
    ensure_images(kube.ctx, [default_image("16"), default_image("17")])
    kube.kubectl("create", "namespace", NS, check=False)
    pg17 = postgresql_binaries("17.11", RUNTIME)
    load_before = os.getloadavg()
    runs = [one_run(kube, pg17, run, args.scale, args.storage) for run in range(args.runs)]

    def median(how: str, key: str) -> float:
        return round(statistics.median(float(r[how][key]) for r in runs), 2)

    print(json.dumps({
        "bench": "major_upgrade", "from": "16", "to": "17", "scale": args.scale, "runs": runs,
        "in_place_outage_s": median("in_place", "write_outage_s"),
        "dump_restore_outage_s": median("dump_restore", "write_outage_s"),
        "rows_lost": sum(int(r["in_place"]["rows_lost"]) for r in runs),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }), flush=True)  # fmt: skip
    kube.kubectl("delete", "namespace", NS, "--ignore-not-found", timeout=600)


if __name__ == "__main__":
    main()
