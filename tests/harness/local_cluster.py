"""The local cluster (localkube) as tests see it: `Kube`, one running profile with its admin kubeconfig,
and `ClusterManager`, which brings the profile a tier needs up for the session and down afterwards."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from harness.paths import LOCALKUBE, REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the localkube package

from localkube.common import Context
from localkube.topology import requested_nodes


@dataclass
class Kube:
    """A running local cluster as tests see it."""

    profile: str
    kubeconfig: str
    ctx: Context = field(repr=False)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
        cmd = [str(self.ctx.bin / "kubectl"), "--kubeconfig", self.kubeconfig, *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
        return res

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}


class ClusterManager:
    """Brings profiles up and down on behalf of the test session.

    No time limit on `up`: on a cold machine it builds the Kubernetes binaries first (over an hour
    under load); the per-test timeout does not cover fixture set-up for the same reason."""

    def __init__(self) -> None:
        self.ctx = Context()
        self.started: str | None = None

    def running(self) -> str | None:
        """The running profile, with its node count when that is not what PGOP_FULL_NODES asks for
        (`full/1`, `full/3`): such a cluster is not the one wanted, and ensure() starts it again."""
        res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), "status"],
                             capture_output=True, text=True)  # fmt: skip
        if res.returncode != 0:
            return None
        fields = dict(
            line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line and line[0] != " "
        )
        profile = fields.get("profile", "").strip() or None
        have = fields.get("nodes", "1").strip()
        if profile == "full" and have != str(requested_nodes(os.environ)):
            return f"full/{have}"
        return profile

    def _run(self, *args: str) -> None:
        res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), *args],
                             capture_output=True, text=True)  # fmt: skip
        if res.returncode != 0:
            pytest.fail(f"localkube {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}", pytrace=False)

    def ensure(self, profile: str) -> Kube:
        current = self.running()
        if current != profile:
            if current is not None:
                self._run("down")
            self._run("up", profile)
            self.started = profile
        return Kube(profile=profile, kubeconfig=str(self.ctx.admin_kubeconfig), ctx=self.ctx)

    def forget(self) -> None:
        """A test stopped the cluster itself: nothing is left for the session to stop."""
        self.started = None

    def finish(self) -> None:
        if self.started and os.environ.get("PGOP_KEEP_CLUSTER") != "1":
            self._run("down")
