"""`cluster-down` leaves nothing behind. Runs last in its tier: it stops the cluster the tier used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from localkube import controlplane
from localkube.common import port_holder
from localkube.teardown import leftovers

from harness.local_cluster import ClusterManager, Kube
from harness.paths import LOCALKUBE


def processes_naming(needle: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        line = b" ".join(argv).decode(errors="replace")
        if needle in line and state != "Z":
            found.append(f"{proc.name}: {line[:160]}")
    return found


@pytest.mark.cluster_lifecycle
def test_kwok_down_leaves_nothing_behind(kube: Kube, cluster_manager: ClusterManager) -> None:
    ctx = kube.ctx
    assert processes_naming(str(ctx.state)), "the kwok profile should be running before down"
    res = subprocess.run(
        [sys.executable, str(LOCALKUBE / "cluster.py"), "down"], capture_output=True, text=True, timeout=180
    )
    cluster_manager.forget()
    assert res.returncode == 0, res.stderr
    assert processes_naming(str(ctx.state)) == []
    for name in (*controlplane.COMPONENTS, "kwok"):
        assert ctx.pid_of(name) is None, f"{name} still runs"
    busy = {port: port_holder(port) for port in controlplane.PORTS if port_holder(port)}
    assert busy == {}, f"ports still held: {busy}"
    assert not ctx.state.exists(), f"{ctx.state} was not removed"
    assert leftovers(ctx) == []
    again = subprocess.run(
        [sys.executable, str(LOCALKUBE / "cluster.py"), "down"], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
