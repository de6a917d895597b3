"""What the full profile's node leaves on the host, found and removed: processes, cgroups, mounts,
pod netns, links, iptables rules.

Everything the node creates on the host is recognisable as ours, so teardown removes exactly that:
- processes: whose command line names our state or run directory (or our provisioner script);
- cgroups: everything under /localkube (another state directory: /localkube-<hash>) in each cgroup
  hierarchy (the kubelet's cgroupRoot);
- mounts: everything under the state directory, the run directory and our pods' netns files;
- network: the bridge BRIDGE, its veths, netns `cni-*` holding a pod-CIDR address, iptables chains
  KUBE-*, CNI-* and LOCALKUBE-* and the rules that jump to them; with many nodes also their netns
  (`localkube-node-*`: their tables and ipsets go with them), the node bridge and its veths.
This machine's PID 1 does not reap, and container cgroups are outside the session's cgroup, so
nothing of this goes away by itself when the processes are killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from ipaddress import IPv4Network
from pathlib import Path

from localkube import netpol, network, nodenet
from localkube.common import RUN_DIR, ClusterError, Context, node_dirs
from localkube.host import cgroup_parent, restore_sysctls, v1_hierarchies
from localkube.network import NETNS_DIR
from localkube.topology import CLUSTER_POD_CIDR, load_layout


def _pod_networks(ctx: Context) -> list[IPv4Network]:
    """Where our pods' addresses are: the single node's pod CIDR, and with many nodes (or what is left of
    them) the whole cluster range their slices are cut from."""
    try:
        layout = load_layout(ctx)
    except ClusterError:
        layout = []  # unreadable: what is left on the host still says whether there were many nodes
    multi = bool(layout or nodenet.our_node_netns() or nodenet.our_links())
    return [network.POD_NET, *([IPv4Network(CLUSTER_POD_CIDR)] if multi else [])]


def clean(ctx: Context) -> None:
    """Remove every trace of a node whose daemons were stopped (or died). Raises ClusterError when a
    mount under our directories cannot be removed."""
    _kill_our_processes(ctx)
    _kill_cgroup_processes(ctx, signal.SIGKILL)
    _wait_cgroups_empty(ctx, 5)
    ours = network.our_netns(_pod_networks(ctx))
    _unmount_ours(ctx, ours)
    network.delete_netns(ours)
    nodenet.remove_leftovers()  # a multi-node cluster's node netns, links and bridge
    network.delete_links()
    network.clean_iptables()
    network.clean_nftables()
    netpol.clean_ipsets()  # once no rule refers to them
    _remove_cgroups(ctx)
    d = node_dirs(ctx)
    shutil.rmtree(d["cni_ipam"], ignore_errors=True)
    if not _mounts_under(d["kubelet_root"]):
        shutil.rmtree(d["kubelet_root"], ignore_errors=True)
    # Its metadata would list containers whose tasks are gone: the next start begins afresh.
    if not _mounts_under(d["containerd_root"]):
        shutil.rmtree(d["containerd_root"], ignore_errors=True)
    if RUN_DIR.is_dir() and not [m for m in _mounts_under(RUN_DIR) if m != str(RUN_DIR)]:
        # Emptied, never removed: the directory may be the mount point of a private cluster's tmpfs, in
        # this mount namespace (hack/private-netns.sh) or in another one, and removing a mount point
        # detaches the mounts on it in every namespace (a private cluster lost its containerd socket so).
        for child in RUN_DIR.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    restore_sysctls(ctx)
    remaining = _mount_leftovers(ctx)
    if remaining:
        raise ClusterError(
            "could not unmount (the state directory is kept so nothing under them is "
            "deleted):\n  " + "\n  ".join(remaining)
        )


def stop_pods(ctx: Context) -> None:
    """SIGTERM every container process (databases shut down cleanly), SIGKILL what is left after 5 s."""
    _kill_cgroup_processes(ctx, signal.SIGTERM)
    if not _wait_cgroups_empty(ctx, 5):
        _kill_cgroup_processes(ctx, signal.SIGKILL)
        _wait_cgroups_empty(ctx, 5)


def leftovers(ctx: Context) -> list[str]:
    """What of a node is still on this host: an empty list after a clean `down`."""
    found = [f"process {pid}: {' '.join(argv)[:160]}" for pid, argv in _our_processes(ctx)]
    found += [f"container process {pid}" for pid in sorted(_live(_cgroup_pids(ctx)))]
    found += _mount_leftovers(ctx)
    found += [f"netns {ns}" for ns in network.our_netns(_pod_networks(ctx))]
    found += [f"netns {ns}" for ns in nodenet.our_node_netns()]
    found += [f"link {name}" for name in network.our_links() + nodenet.our_links()]
    for cmd in network.iptables_cmds():
        for table in network.IPTABLES_TABLES:
            chains, jumps = network.iptables_state(cmd, table)
            found += [f"{cmd} -t {table} chain {c}" for c in chains]
            found += [f"{cmd} -t {table} rule {' '.join(r)}" for r in jumps]
    found += [f"ipset {name}" for name in netpol.our_ipsets()]
    found += [f"cgroup {d}" for d in _our_cgroup_dirs(ctx)]
    return found


# processes --------------------------------------------------------------------------------------------

_OUR_EXES = {
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim",
    "containerd-shim-runc-v1",
    "containerd-shim-runc-v2",
    "coredns",
    "kube-router",
}


def _proc_list() -> list[tuple[int, str, list[str]]]:
    """(pid, state, argv) of every live process."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv:
            out.append((int(entry.name), state, argv))
    return out


def _mount_ns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def _our_processes(ctx: Context) -> list[tuple[int, list[str]]]:
    found = []
    own_ns = _mount_ns("self")
    for pid, state, argv in _proc_list():
        if state == "Z" or pid == os.getpid():
            continue
        exe = Path(argv[0]).name
        line = " ".join(argv)
        provisioner = any(a.endswith("hostpath/provisioner.py") for a in argv[:3])
        # RUN_DIR is the same path for every cluster; only in our own mount namespace is it ours (a
        # cluster in hack/private-netns.sh has a private one, and shares the pid namespace with the
        # host's: matching on the path alone killed the host cluster's shims).
        ours = str(ctx.state) in line or (str(RUN_DIR) in line and _mount_ns(pid) == own_ns)
        if (exe in _OUR_EXES and ours) or (provisioner and str(ctx.state) in line):
            found.append((pid, argv))
    return found


def _kill_our_processes(ctx: Context) -> None:
    """What is left once the daemons were stopped by pid: shims, or daemons of a lost state dir."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 3.0)):
        procs = _our_processes(ctx)
        if not procs:
            return
        for pid, _ in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _our_processes(ctx):
            time.sleep(0.1)


# cgroups ------------------------------------------------------------------------------------------------


def _our_cgroup_dirs(ctx: Context) -> list[Path]:
    """Every cgroup under our root in every v1 hierarchy, deepest first."""
    dirs: list[Path] = []
    for h in v1_hierarchies():
        top = h / cgroup_parent(ctx)
        if top.is_dir():
            dirs += [Path(p) for p, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids(ctx: Context) -> set[int]:
    pids: set[int] = set()
    for d in _our_cgroup_dirs(ctx):
        try:
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            continue
    return pids


def _live(pids: set[int]) -> set[int]:
    live = set()
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                live.add(pid)
        except OSError:
            continue
    return live


def _kill_cgroup_processes(ctx: Context, sig: signal.Signals) -> None:
    for pid in _live(_cgroup_pids(ctx)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_cgroups_empty(ctx: Context, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _live(_cgroup_pids(ctx)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _remove_cgroups(ctx: Context) -> None:
    for d in _our_cgroup_dirs(ctx):
        with contextlib.suppress(OSError):
            d.rmdir()


# mounts -------------------------------------------------------------------------------------------------


def _mountpoints() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].encode().decode("unicode_escape") for line in f]


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mounts_under(root: Path) -> list[str]:
    return [m for m in _mountpoints() if _under(m, [str(root)])]


def _mount_roots(ctx: Context, netns: list[str]) -> list[str]:
    return [str(ctx.state), str(RUN_DIR), *(str(NETNS_DIR / ns) for ns in netns)]


def _ours_to_unmount(m: str, roots: list[str]) -> bool:
    # A mount exactly at RUN_DIR is hack/private-netns.sh's private tmpfs: unmounting it would uncover
    # the host's own RUN_DIR (the same directory on the root filesystem), and the rmtree that follows
    # would delete the host cluster's containerd state. Mounts below it are ours.
    return m != str(RUN_DIR) and _under(m, roots)


def _unmount_ours(ctx: Context, netns: list[str]) -> None:
    roots = _mount_roots(ctx, netns)
    for _ in range(3):
        targets = [m for m in _mountpoints() if _ours_to_unmount(m, roots)]
        if not targets:
            return
        for m in sorted(set(targets), key=lambda p: p.count("/"), reverse=True):
            if subprocess.run(["umount", m], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", m], capture_output=True)


def _mount_leftovers(ctx: Context) -> list[str]:
    roots = _mount_roots(ctx, network.our_netns())
    return [f"mount {m}" for m in _mountpoints() if _ours_to_unmount(m, roots)]
