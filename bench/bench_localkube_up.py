"""Benchmark of the full profile's `up` with one node and with N real nodes. Prints one JSON line.

For each node count: `up full` three times, each after a `down`; the seconds to import the base image
into every node's containerd; and for a multi-node cluster its idle cost over `--idle` seconds (CPU,
user+system of every component in percent of one core, and RSS, per component kind and in total) and
the seconds each node verb takes on its last node (poweron: until the Node is Ready).
"Cold" is the first `up` of the run: a fresh state directory (new certificates, empty etcd and empty
containerd roots, the pause image imported); "warm" the next two, the same work with the page cache
warm. Binaries and image builds are cached beforehand; their cold build is bench_localkube.py's.

    python3 bench/bench_localkube_up.py [--nodes 1,3] [--idle 60]

Targets (not asserted): warm up of 3 nodes <= 45 s, at most 1.5x one node's; idle CPU of 3 nodes
<= 30 % of one core.
It refuses to run while a cluster is up (it would have to stop it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localkube import controlplane, nodes, topology  # noqa: E402
from localkube.common import Context  # noqa: E402
from localkube.images.containerd import ensure_images  # noqa: E402

CLUSTER = [sys.executable, str(REPO / "localkube" / "cluster.py")]
HOST_COMPONENTS = (*controlplane.COMPONENTS, "coredns", "provisioner")
BASE_IMAGE = "localkube.local/base:bookworm"
TICKS = os.sysconf("SC_CLK_TCK")
NODE_VERBS = ("partition", "heal", "poweroff", "poweron")  # poweron: until the Node is Ready again


def run(*args: str, count: int, timeout: float = 900) -> float:
    env = {**os.environ, topology.NODES_VARIABLE: str(count)}
    start = time.monotonic()
    res = subprocess.run([*CLUSTER, *args], capture_output=True, text=True, timeout=timeout, env=env)
    if res.returncode != 0:
        raise SystemExit(f"localkube {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return round(time.monotonic() - start, 1)


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def shim_pids(ctx: Context) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"containerd-shim-runc-v2")
            and str(ctx.state).encode() in b" ".join(argv)
        ):
            out.append(int(entry.name))
    return out


def idle_cost(ctx: Context, seconds: float) -> dict[str, Any]:
    """CPU and RSS of every component over `seconds` of an idle cluster, grouped by kind."""
    named: dict[str, int] = {}
    for name in [*HOST_COMPONENTS, *nodes.components(topology.load_layout(ctx)), "containerd", "kubelet"]:
        pid = ctx.pid_of(name)
        if pid is not None:
            named[name] = pid
    for i, pid in enumerate(shim_pids(ctx)):
        named[f"shim-{i}"] = pid
    before = {n: cpu_seconds(p) for n, p in named.items()}
    time.sleep(seconds)
    kinds: dict[str, dict[str, float]] = {}
    for name, pid in named.items():
        kind = "shim" if name.startswith("shim-") else name.rsplit("/", 1)[-1]
        k = kinds.setdefault(kind, {"cpu_pct": 0.0, "rss_mib": 0.0, "count": 0})
        k["cpu_pct"] += 100 * (cpu_seconds(pid) - before[name]) / seconds
        k["rss_mib"] += rss_mib(pid)
        k["count"] += 1
    rounded = {kind: {key: round(v, 1) for key, v in k.items()} for kind, k in kinds.items()}
    return {
        "seconds": seconds,
        "by_kind": rounded,
        "cpu_pct_total": round(sum(k["cpu_pct"] for k in kinds.values()), 1),
        "rss_mib_total": round(sum(k["rss_mib"] for k in kinds.values()), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="1,3", help="node counts to measure, comma-separated")
    p.add_argument("--idle", type=float, default=60, help="seconds of idle measurement per multi-node run")
    a = p.parse_args()
    ctx = Context()
    if ctx.profile_file.exists():
        raise SystemExit("a local cluster is up here; run `python3 localkube/cluster.py down` first")
    result: dict[str, Any] = {"bench": "localkube_up", "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for count in (int(c) for c in a.nodes.split(",")):
        ups = []
        entry: dict[str, Any] = {}
        for _ in range(3):
            ups.append(run("up", "full", count=count))
            if "image_import_s" not in entry:
                started = time.monotonic()
                ensure_images(ctx, [BASE_IMAGE])
                entry["image_import_s"] = round(time.monotonic() - started, 1)
            if count > 1 and "idle" not in entry:
                time.sleep(10)  # start-up work settles (first syncs, image GC's first pass)
                entry["idle"] = idle_cost(ctx, a.idle)
                last = topology.load_layout(ctx)[-1].name
                entry["verbs_s"] = {verb: run(verb, last, count=count) for verb in NODE_VERBS}
            entry.setdefault("down_s", []).append(run("down", count=count))
        entry.update({"up_cold_s": ups[0], "up_warm_s": ups[1:]})
        result[f"nodes_{count}"] = entry
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
