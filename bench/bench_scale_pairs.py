#!/usr/bin/env python3
"""The operator against the true floor at scale, each half on a fresh local cluster. Prints one JSON line.

    python3 bench/bench_scale_pairs.py --clusters 1000 --pairs 3 [--first floor] [--label HEAD]

`bench_reconcile_scale.py` runs both halves on one API server, so whichever goes second meets etcd,
the API server and kwok already holding the first half's clusters and pods (at 1000 clusters that cost
the second half 20-40 %, more than the difference being measured). Here every half starts from
`localkube/cluster.py down` and `up kwok` (two fake nodes), and runs `bench_reconcile_scale.py` with
`--no-floor` or `--no-operator`; the order inside a pair alternates from pair to pair, starting with
`--first`, so drift over the session falls on both methods alike. Needs the default local-cluster state
directory to itself for the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KUBE = [sys.executable, str(REPO / "localkube" / "cluster.py")]


def _fresh_cluster() -> None:
    subprocess.run([*KUBE, "down"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*KUBE, "up", "kwok"], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PGOP_KWOK_NODES": "2"})  # fmt: skip


def _half(method: str, args: argparse.Namespace) -> dict[str, Any]:
    _fresh_cluster()
    only = "--no-floor" if method == "operator" else "--no-operator"
    python = REPO / ".venv" / "bin" / "python"
    out = subprocess.run(
        [str(python), str(REPO / "bench" / "bench_reconcile_scale.py"), "--clusters", str(args.clusters),
         "--timeout", str(args.timeout), "--label", args.label, only],
        check=True, stdout=subprocess.PIPE, text=True,
    ).stdout  # fmt: skip
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    result: dict[str, Any] = json.loads(line)
    return result


def summarize(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios per pair and per position (pure: the pairs as `main` records them)."""
    ratios = [p["ratio_to_floor"] for p in pairs]
    first = {m: [p[m]["seconds_to_all_ready"] for p in pairs if p["order"][0] == m]
             for m in ("operator", "floor")}  # fmt: skip
    return {
        "ratios": ratios,
        "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        "seconds_when_first": first,
        "peak_rss_mib_max": max((p["operator"]["peak_rss_mib"] for p in pairs), default=None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--first", choices=("operator", "floor"), default="operator")
    parser.add_argument("--timeout", type=float, default=3000.0)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    pairs: list[dict[str, Any]] = []
    order = ["operator", "floor"] if args.first == "operator" else ["floor", "operator"]
    try:
        for _ in range(args.pairs):
            pair: dict[str, Any] = {"order": list(order)}
            for method in order:
                half = _half(method, args)
                pair[method] = half[method]
                pair[f"load_average_{method}_start"] = half["load_average_start"]
            pair["ratio_to_floor"] = round(
                pair["operator"]["seconds_to_all_ready"] / pair["floor"]["seconds_to_all_ready"], 2
            )
            print(json.dumps({"pair": len(pairs) + 1, **pair}), file=sys.stderr, flush=True)
            pairs.append(pair)
            order.reverse()
    finally:
        subprocess.run([*KUBE, "down"], check=False, stdout=subprocess.DEVNULL)
    print(json.dumps({"bench": "scale_pairs", "clusters": args.clusters, "label": args.label,
                      **summarize(pairs), "pairs": pairs}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
