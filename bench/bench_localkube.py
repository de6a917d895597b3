"""Benchmark of the local cluster itself. Prints one JSON line.

- cold build: seconds per binary group, from `$PGOP_CACHE/bin/<group>/.build-seconds` (written by
  localkube/build-binaries.sh) or from `<group> <version>: built in N s` lines of --build-log files;
  a cold build is not re-run here (it takes 15-30 minutes on 2 cores).
- warm `cluster-up` per profile (binaries and images cached), the control plane's RSS once up (etcd,
  kube-apiserver, kube-controller-manager, kube-scheduler; and the node's components for `full`),
  and `cluster-down` time.

    python3 bench/bench_localkube.py [--profiles kwok,full] [--build-log /tmp/build-k8s.log ...]

Targets (not asserted): warm up kwok <= 20 s, full <= 45 s.
It refuses to run while a cluster is up, unless --take-over (it would have to stop that cluster).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localkube.common import Context  # noqa: E402

CLUSTER = [sys.executable, str(REPO / "localkube" / "cluster.py")]
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE = ("containerd", "kubelet", "kube-proxy", "coredns", "provisioner")


def run(*args: str, timeout: float = 900) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    res = subprocess.run([*CLUSTER, *args], capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - start, res


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cold_build(logs: list[Path], cache: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for marker in sorted((cache / "bin").glob("*/.build-seconds")):
        out[marker.parent.name] = {"seconds": int(marker.read_text().split()[0]), "source": str(marker)}
    for log in logs:
        for m in re.finditer(r"^(\S+) (\S+): built in (\d+) s$", log.read_text(errors="replace"), re.M):
            out.setdefault(f"{m.group(1)}-{m.group(2)}", {"seconds": int(m.group(3)), "source": str(log)})
    return out


def bench_profile(ctx: Context, profile: str) -> dict[str, Any]:
    up_s, res = run("up", profile)
    if res.returncode != 0:
        return {"error": f"up {profile} failed: {res.stderr.strip()[-500:]}"}
    names = CONTROL_PLANE + (NODE if profile == "full" else ("kwok",))
    rss = {n: round(rss_mib(ctx.pid_of(n)), 1) for n in names}
    extra: dict[str, Any] = {}
    if profile == "full":
        from localkube.images.containerd import ensure_images

        start = time.monotonic()  # the smoke-test image: tar cached, so this is the ctr import
        ensure_images(ctx, ["localkube.local/base:bookworm"])
        extra["base_image_import_s"] = round(time.monotonic() - start, 1)
    again_s, _ = run("up", profile)  # already running: the no-op path
    down_s, res = run("down")
    result: dict[str, Any] = {
        "warm_up_s": round(up_s, 1),
        "up_when_running_s": round(again_s, 1),
        "down_s": round(down_s, 1),
        "control_plane_rss_mib": round(sum(rss[n] for n in CONTROL_PLANE), 1),
        "rss_mib": rss,
        **extra,
    }
    if res.returncode != 0:
        result["error"] = f"down failed: {res.stderr.strip()[-500:]}"
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", default="kwok,full")
    p.add_argument("--build-log", action="append", default=[], type=Path)
    p.add_argument("--take-over", action="store_true", help="stop a running cluster first")
    a = p.parse_args()
    ctx = Context()
    status = subprocess.run([*CLUSTER, "status"], capture_output=True, text=True)
    if status.returncode == 0 or "profile:" in status.stdout:
        if not a.take_over:
            print("a cluster is running; stop it or pass --take-over", file=sys.stderr)
            return 2
        run("down")
    # Make sure every binary is built before timing a warm start (a no-op when cached).
    subprocess.run([str(REPO / "localkube" / "build-binaries.sh")], capture_output=True, check=True)
    result: dict[str, Any] = {"bench": "localkube", "cold_build": cold_build(a.build_log, ctx.cache)}
    for profile in a.profiles.split(","):
        result[profile] = bench_profile(ctx, profile)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
