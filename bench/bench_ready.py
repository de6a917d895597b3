"""Apply → Ready of a 3-instance cluster on the full profile, split into where the time goes: one JSON line.

From the objects' own timestamps (pod conditions, container start, the Ready condition) and Patroni's log
lines (kubectl logs --timestamps), per trial:
- operator_to_statefulset_s: `kubectl apply` → the StatefulSet exists (the operator's first pass);
- per instance: scheduled, container started, bootstrap (initdb on the first, a base backup from the
  primary on the others, as Patroni logs them) and pod Ready, each in seconds after the apply;
- operator_report_s: the last pod Ready → the cluster's Ready condition (the operator's reporting share);
- apply_to_ready_s: the apply → `kubectl wait --for=condition=Ready` returned.
Medians over trials; the machine is shared, so the load average is in the JSON.

  python3 localkube/cluster.py up full && .venv/bin/python bench/bench_ready.py --trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

from localkube.common import Context  # noqa: E402

from harness.deployed_operator import install_operator  # noqa: E402
from harness.kube import get_json  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402

NS, NAME = "bench-ready", "ready-db"
SMALL = {"requests": {"cpu": "100m", "memory": "512Mi"}}
# Patroni's log lines that open and close each instance's bootstrap.
BOOTSTRAP_MARKS = {
    "initdb": ("trying to bootstrap a new cluster", "initialized a new cluster"),
    "basebackup": ("trying to bootstrap from leader", "replica has been created using basebackup"),
}


def parse_time(value: str) -> float:
    """RFC 3339 with any number of fraction digits (kubectl logs gives nanoseconds)."""
    value = value.rstrip("Z")
    whole, _, fraction = value.partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def condition_time(obj: dict[str, Any], kind: str) -> float | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return parse_time(cond["lastTransitionTime"])
    return None


def bootstrap_span(kube: Kube, pod: str) -> tuple[str, float, float] | None:
    logs = kube.kubectl("logs", "-n", NS, pod, "-c", "postgres", "--timestamps", check=False).stdout
    for kind, (start_mark, end_mark) in BOOTSTRAP_MARKS.items():
        start = end = None
        for line in logs.splitlines():
            stamp, _, text = line.partition(" ")
            if start is None and start_mark in text:
                start = parse_time(stamp)
            elif start is not None and end_mark in text:
                end = parse_time(stamp)
                break
        if start is not None and end is not None:
            return kind, start, end
    return None


def trial(kube: Kube, index: int) -> dict[str, Any]:
    name = f"{NAME}-{index}"
    body = {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": 3, "version": "16", "storage": "1Gi", "resources": SMALL},
    }
    applied = datetime.now(UTC).timestamp()
    started = time.monotonic()
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    kube.kubectl(
        "-n", NS, "wait", f"postgrescluster/{name}", "--for=condition=Ready", "--timeout=900s", timeout=920
    )
    out: dict[str, Any] = {"apply_to_ready_s": time.monotonic() - started}
    sts = get_json(kube, "statefulset", name, "-n", NS)
    out["operator_to_statefulset_s"] = parse_time(sts["metadata"]["creationTimestamp"]) - applied
    pods = sorted(
        get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={name}")["items"],
        key=lambda p: p["metadata"]["name"],
    )
    last_ready = 0.0
    for pod in pods:
        ordinal = pod["metadata"]["name"].rsplit("-", 1)[1]
        scheduled = condition_time(pod, "PodScheduled")
        ready = condition_time(pod, "Ready")
        container = next(c for c in pod["status"]["containerStatuses"] if c["name"] == "postgres")
        running = (container.get("state") or {}).get("running") or {}
        row = {
            "scheduled_s": scheduled,
            "container_started_s": (parse_time(running["startedAt"]) if running.get("startedAt") else None),
            "ready_s": ready,
        }
        span = bootstrap_span(kube, pod["metadata"]["name"])
        if span:
            row[f"{span[0]}_start_s"], row[f"{span[0]}_done_s"] = span[1], span[2]
            out[f"pod{ordinal}_{span[0]}_duration_s"] = span[2] - span[1]
        for key, value in row.items():
            if value is not None:
                out[f"pod{ordinal}_{key}"] = value - applied
        last_ready = max(last_ready, ready or 0.0)
    # Role-neutral summary (all pods start together; whichever wins the bootstrap race runs initdb).
    for kind in BOOTSTRAP_MARKS:
        spans = [v for k, v in out.items() if k.endswith(f"_{kind}_duration_s")]
        if spans:
            out[f"{kind}_max_s"] = max(spans)
    started = [v for k, v in out.items() if k.endswith("_container_started_s")]
    if started:
        out["all_containers_started_s"] = max(started)
    out["last_pod_ready_s"] = last_ready - applied
    cluster_ready = condition_time(get_json(kube, "pgc", name, "-n", NS), "Ready")
    if cluster_ready and last_ready:
        out["operator_report_s"] = cluster_ready - last_ready
    kube.kubectl("delete", "pgc", name, "-n", NS, "--wait=true", timeout=300)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--installed",
        action="store_true",
        help="use the images and the operator already in the cluster (no rebuild when src/ changed since)",
    )
    args = parser.parse_args()
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    if not args.installed:
        install_operator(kube)
    kube.kubectl("create", "namespace", NS, check=False)
    load_before = os.getloadavg()
    rows = []
    try:
        for i in range(args.trials):
            rows.append(trial(kube, i))
            print(
                f"trial {i + 1}: {json.dumps({k: round(v, 2) for k, v in rows[-1].items()})}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    out: dict[str, Any] = {"bench": "apply_to_ready", "trials": args.trials, "replicas": 3}
    for key in sorted({k for r in rows for k in r}):
        values = [r[key] for r in rows if key in r]
        out[f"{key}_p50"] = round(statistics.median(values), 2)
    out["load_avg_1m_before"] = round(load_before[0], 2)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
