"""What the scale bench reads off a process and prints while it runs: CPU seconds, RSS, progress lines."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.operator_process import OperatorProcess


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def peak_rss_mib(pid: int, field: str = "VmHWM") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def metrics_of(op: OperatorProcess) -> dict[str, float]:
    """The operator's metrics; a starved operator can take more than the harness's 2 s to answer."""
    deadline = time.monotonic() + 120
    while True:
        try:
            metrics: dict[str, float] = op.metrics()
            return metrics
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def scrape_cost(op: OperatorProcess, scrapes: int = 20) -> dict[str, float]:
    """What one scrape of the operator's /metrics costs: wall time (median, max), size, samples, and the
    operator's CPU per scrape beyond what it spends idle over as long (measured right before)."""
    idle_from, idle_cpu = time.monotonic(), cpu_seconds(op.pid)
    time.sleep(5)
    idle_rate = (cpu_seconds(op.pid) - idle_cpu) / (time.monotonic() - idle_from)
    walls: list[float] = []
    text = ""
    started, cpu_before = time.monotonic(), cpu_seconds(op.pid)
    for _ in range(scrapes):
        began = time.perf_counter()
        text = op.metrics_text()
        walls.append(time.perf_counter() - began)
    spent = cpu_seconds(op.pid) - cpu_before - idle_rate * (time.monotonic() - started)
    return {
        "scrapes": scrapes,
        "wall_ms_median": round(statistics.median(walls) * 1000, 1),
        "wall_ms_max": round(max(walls) * 1000, 1),
        "cpu_ms_per_scrape": round(max(spent, 0.0) / scrapes * 1000, 1),
        "bytes": len(text.encode()),
        "samples": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
    }
