"""The host side of the full profile's node: prerequisites, kernel settings (set, and put back on
`down`), and the cgroup root the kubelet puts pods under."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from localkube.common import DEFAULT_STATE, ClusterError, Context, node_dirs, write_json

# Debian packages the node needs (cli.py installs them with --install; .ci/run too).
APT_PACKAGES = [
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "conntrack",
    "debootstrap",
    "socat",
    "util-linux",
    "iproute2",
    "gcc",
    "libc6-dev",
    "ipset",
    "nftables",
]
# what must exist -> the package that provides it
_CNI_PKG = "containernetworking-plugins"
_PREREQ_FILES = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "/usr/lib/cni/bridge": _CNI_PKG,
    "/usr/lib/cni/host-local": _CNI_PKG,
    "/usr/lib/cni/portmap": _CNI_PKG,
    "/usr/lib/cni/loopback": _CNI_PKG,
    "iptables": "iptables",
    "iptables-save": "iptables",
    "conntrack": "conntrack",
    "debootstrap": "debootstrap",
    "socat": "socat",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "ip": "iproute2",
    "gcc": "gcc",
    "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev",
    "ipset": "ipset",  # kube-router's NetworkPolicy controller (localkube/netpol.py)
    "nft": "nftables",  # kube-proxy's nftables mode (PGOP_PROXY_MODE, node.py)
}

DEFAULT_CGROUP_PARENT = "localkube"
CGROUP_V1 = Path("/sys/fs/cgroup")

# Kernel settings the kubelet insists on (protectKernelDefaults: it refuses to start otherwise, and
# never rewrites them itself). Setting them here, once and visibly, is the deliberate choice.
KUBELET_SYSCTLS = {
    "vm.overcommit_memory": "1",
    "vm.panic_on_oom": "0",
    "kernel.panic": "10",
    "kernel.panic_on_oops": "1",
    "kernel.keys.root_maxkeys": "1000000",
    "kernel.keys.root_maxbytes": "25000000",
}
NETWORK_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    # Pod → Service → pod on the same bridge needs the bridge's traffic to pass iptables (kube-proxy's
    # DNAT and its reverse); the kernel here has br_netfilter built in.
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}
MINIMUM_SYSCTLS = {"fs.inotify.max_user_instances": 1024, "fs.inotify.max_user_watches": 524288}


def missing_prereqs() -> list[tuple[str, str]]:
    missing: dict[str, str] = {}
    for what, pkg in _PREREQ_FILES.items():
        found = Path(what).exists() if what.startswith("/") else shutil.which(what) is not None
        if not found:
            missing.setdefault(pkg, what)
    if not CGROUP_V1.joinpath("memory").is_dir() and not CGROUP_V1.joinpath("cgroup.controllers").exists():
        missing["cgroups"] = "cgroup filesystem"
    return [(what, f"apt-get install -y {pkg}") for pkg, what in missing.items() if pkg != "cgroups"] + (
        [("a mounted cgroup filesystem", "mount the cgroup hierarchies (/sys/fs/cgroup)")]
        if "cgroups" in missing
        else []
    )


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _set_sysctl(name: str, value: str, required: bool) -> None:
    path = _sysctl_path(name)
    try:
        if path.read_text().strip() != value:
            path.write_text(value + "\n")
    except OSError as e:
        if required:
            raise ClusterError(f"cannot set sysctl {name}={value}: {e}") from None


def prepare(ctx: Context) -> None:
    """The kernel settings and cgroups the node needs, and its directories (as root); safe to repeat."""
    _save_sysctls(ctx)
    if Path("/lib/modules").is_dir():  # modules may be built in (as on this VM); then modprobe is moot
        for mod in ("overlay", "br_netfilter"):
            subprocess.run(["modprobe", mod], capture_output=True)
    _set_sysctl("net.ipv4.ip_forward", "1", required=True)
    for name, value in NETWORK_SYSCTLS.items():
        _set_sysctl(name, value, required=_sysctl_path(name).exists())
    for name, value in KUBELET_SYSCTLS.items():
        _set_sysctl(name, value, required=True)
    for name, minimum in MINIMUM_SYSCTLS.items():
        try:
            if int(_sysctl_path(name).read_text()) < minimum:
                _sysctl_path(name).write_text(f"{minimum}\n")
        except (OSError, ValueError):
            pass
    _ensure_cgroup_root(ctx)
    for d in node_dirs(ctx).values():
        d.mkdir(parents=True, exist_ok=True)


# kube-proxy sets route_localnet itself (NodePorts on localhost); it is restored with the rest.
_RESTORED_SYSCTLS = (*NETWORK_SYSCTLS, *KUBELET_SYSCTLS, *MINIMUM_SYSCTLS, "net.ipv4.conf.all.route_localnet")


def _sysctl_record(ctx: Context) -> Path:
    return ctx.state / "node" / "sysctls-before.json"


def _save_sysctls(ctx: Context) -> None:
    """Remember the host's kernel settings before the node changes them, so `down` puts them back."""
    record = _sysctl_record(ctx)
    if record.exists():  # an earlier start's record holds the true originals
        return
    values = {}
    for name in _RESTORED_SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = _sysctl_path(name).read_text().strip()
    write_json(record, values)


def restore_sysctls(ctx: Context) -> None:
    record = _sysctl_record(ctx)
    try:
        values = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    for name, value in values.items():
        with contextlib.suppress(OSError):
            if _sysctl_path(name).read_text().strip() != value:
                _sysctl_path(name).write_text(value + "\n")
    record.unlink()


def v1_hierarchies() -> list[Path]:
    """Mount points of the cgroup hierarchies, the named (name=systemd) one and a hybrid host's
    cgroup2 (unified) one included: the kubelet and runc create their cgroups in every one of them."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split()[0] in ("cgroup", "cgroup2"):
                out.append(Path(pre.split()[4]))
    return out


def cgroup_parent(ctx: Context) -> str:
    """The kubelet's cgroupRoot, and so the cgroups teardown empties: one per state directory, so a
    second local cluster (another PGOP_STATE, in a network namespace of its own) never kills the
    first one's pods."""
    if ctx.state == DEFAULT_STATE:
        return DEFAULT_CGROUP_PARENT
    return f"{DEFAULT_CGROUP_PARENT}-{hashlib.sha256(str(ctx.state).encode()).hexdigest()[:8]}"


def _ensure_cgroup_root(ctx: Context) -> None:
    """The kubelet's cgroupRoot must exist in every hierarchy (it refuses to start otherwise)."""
    for h in v1_hierarchies():
        d = h / cgroup_parent(ctx)
        d.mkdir(exist_ok=True)
        if (h / "cpuset.cpus").exists():  # a cpuset child is unusable until it has cpus and mems
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((h / knob).read_text())
