"""localkube/build-binaries.sh builds what it is asked for: the demo asks for the full profile's binaries
only (no kwok, no helm), `make test` for all of them; every binary a profile starts is in its list."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from harness.paths import REPO

SCRIPT = REPO / "localkube" / "build-binaries.sh"
# The binaries each component group builds (build-binaries.sh's go build lines).
GROUP_BINARIES = {
    "kubernetes": {"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy",
                   "kubectl"},
    "etcd": {"etcd", "etcdctl"},
    "kwok": {"kwok"},
    "coredns": {"coredns"},
    "kube-router": {"kube-router"},
    "helm": {"helm"},
}  # fmt: skip
# The modules each profile runs its processes from (localkube/cluster.py's up).
PROFILE_MODULES = {
    "kwok": ("controlplane.py", "kwoknodes.py", "common.py"),
    "full": ("controlplane.py", "node.py", "addons.py", "netpol.py", "common.py"),
}


def planned(*args: str, env: dict[str, str] | None = None) -> list[str]:
    inherited = {k: v for k, v in os.environ.items() if k != "PGOP_BINARIES"}
    res = subprocess.run([str(SCRIPT), "--print", *args], capture_output=True, text=True, timeout=30,
                         env=inherited | (env or {}))  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def test_profiles_name_their_components() -> None:
    assert planned("full") == ["kubernetes", "etcd", "coredns", "kube-router"]
    assert planned("kwok") == ["kubernetes", "etcd", "kwok"]
    assert planned() == planned("all") == ["kubernetes", "etcd", "kwok", "coredns", "kube-router", "helm"]
    assert planned("full", "helm") == ["kubernetes", "etcd", "coredns", "kube-router", "helm"]
    assert planned(env={"PGOP_BINARIES": "full"}) == planned("full")
    assert planned("kwok", env={"PGOP_BINARIES": "full"}) == planned("kwok")  # the arguments win


@pytest.mark.parametrize("profile", ["kwok", "full"])
def test_every_binary_a_profile_starts_is_built_for_it(profile: str) -> None:
    started = set()
    for module in PROFILE_MODULES[profile]:
        started |= set(re.findall(r'binary\("([a-z-]+)"\)', (REPO / "localkube" / module).read_text()))
    started |= {"kube-router"} if profile == "full" else set()  # netpol.py names it by a constant
    built = set().union(*(GROUP_BINARIES[g] for g in planned(profile)))
    assert started - built == set(), f"the {profile} profile starts binaries it does not build"


def test_the_demo_asks_for_the_full_profile_only() -> None:
    demo = (REPO / "hack" / "demo.sh").read_text()
    assert "export PGOP_BINARIES=${PGOP_BINARIES:-full}" in demo
    assert demo.index("PGOP_BINARIES") < demo.index("localkube/cluster.py up full")


def test_an_unknown_name_is_refused_naming_it() -> None:
    res = subprocess.run(
        [str(SCRIPT), "--print", "full", "kubelet"], capture_output=True, text=True, timeout=30
    )
    assert res.returncode != 0
    assert "unknown component or profile 'kubelet'" in res.stderr
