"""The restart part of the scale bench (--restart): a fresh operator process over the converged
clusters."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from harness.audit import Audit
from harness.operator_process import OperatorProcess
from harness.waiting import wait_until
from scale.measure import metrics_of, peak_rss_mib


def measure_restart(
    args: argparse.Namespace, audit: Audit, op_config: Path, work: Path, op_ns: str, expected: int
) -> dict[str, Any]:
    """A fresh operator over the converged clusters: how long until every cluster has had a pass (the
    queue empty after at least one pass per cluster), and what it asked of the API server meanwhile —
    a level-triggered operator that lost its memory must find nothing to write."""
    mark = audit.mark()
    started = time.monotonic()
    op = OperatorProcess(
        op_config, work, "bench", "--namespace", op_ns, "--workers", str(args.workers),
        "--resync-seconds", str(args.resync_seconds), "--log-level", "warning",
    ).start()  # fmt: skip
    try:
        op.wait_leader(timeout=args.timeout)  # leading and ready: the cache has synced
        ready_after = time.monotonic() - started

        def passed_all() -> bool:
            metrics = metrics_of(op)
            passes = sum(v for k, v in metrics.items() if k.startswith("pg_operator_reconcile_total{"))
            return passes >= expected and metrics.get("pg_operator_workqueue_depth", 1) == 0

        wait_until(
            "every cluster passed once after the restart", passed_all, timeout=args.timeout, interval=1
        )
        all_passed_after = time.monotonic() - started
        time.sleep(3)
        reqs = audit.requests_since(mark)
        return {
            "seconds_to_leader_and_synced": round(ready_after, 1),
            "seconds_to_every_cluster_passed": round(all_passed_after, 1),
            "peak_rss_mib": round(peak_rss_mib(op.pid), 1),
            "requests": {f"{v} {res}": c for (v, res), c in sorted(reqs.items()) if v != "watch"},
            "writes": sum(c for (v, _), c in reqs.items() if v in ("create", "update", "patch", "delete")),
        }
    finally:
        op.stop()
