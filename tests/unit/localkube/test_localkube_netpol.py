"""kube-router's command line: the firewall controller alone, no listener, the node and Service range
of the local cluster."""

from __future__ import annotations

from pathlib import Path

from localkube import netpol
from localkube.common import NODE_NAME, SERVICE_CIDR, Context


def test_only_the_firewall_runs_and_nothing_listens(tmp_path: Path) -> None:
    (tmp_path / "cache" / "current").mkdir(parents=True)
    (tmp_path / "cache" / "current" / "kube-router").touch()
    argv = netpol.argv(Context(state=tmp_path / "state", cache=tmp_path / "cache"))
    assert argv[0].endswith("/kube-router")
    flags = set(argv[1:])
    assert {"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--run-loadbalancer=false", "--enable-cni=false"} <= flags  # fmt: skip
    assert {"--health-port=0", "--metrics-port=0"} <= flags
    assert f"--hostname-override={NODE_NAME}" in flags
    assert f"--service-cluster-ip-range={SERVICE_CIDR}" in flags
    assert f"--kubeconfig={tmp_path / 'state' / 'admin.kubeconfig'}" in flags
