"""What the scale bench reads off a process and prints while it runs: CPU seconds, RSS, progress lines."""

from __future__ import annotations

import os
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
