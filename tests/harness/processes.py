"""Child processes of a test or a bench: stopped for sure, and never outliving the test process."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """`sig`, then SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def die_with_parent() -> None:
    """A preexec_fn: SIGTERM when the test process dies, so a killed session leaves no child behind
    (Linux prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
