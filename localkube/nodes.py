"""The real nodes of a multi-node full profile (PGOP_FULL_NODES >= 2; layout in topology.py, network in
nodenet.py): each its own containerd, kubelet, kube-proxy and kube-router in its own network namespace;
their start, and the verbs that take a node away and bring it back as a machine would go:

- poweroff: the link is cut first (nothing the dying node says gets out), then its daemons, shims and
  containers are SIGKILLed, its mounts and pods' netns vanish and its namespace is deleted, its runtime
  directory (a /run) is emptied; what a disk keeps stays (images, the kubelet's directory, volumes);
- poweron: the machine boots: namespace and link again, containerd, kubelet, kube-proxy, kube-router;
  returns when the Node is Ready;
- partition / heal: the link cut / restored; every process lives on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from localkube import addons, host, netpol, network, nodenet
from localkube.common import (
    APISERVER_PORT,
    HERE,
    ClusterError,
    Context,
    containerd_address,
    host_ip,
    log,
    node_dirs,
    wait_for,
    write_json,
)
from localkube.images.builder import build
from localkube.images.containerd import import_image
from localkube.images.spec import ImageSpec
from localkube.node import (
    NODES_KUBE_PROXY,
    PAUSE_IMAGE,
    _containerd_config,
    _kube_proxy_config,
    _kubelet_config,
    proxy_mode,
)
from localkube.pki import Pki
from localkube.topology import (
    NodeSpec,
    PowerState,
    load_layout,
    next_state,
    node_state_dir,
    power_state,
    save_layout,
    set_power_state,
)

DAEMONS = ("containerd", "kubelet", "kube-proxy", "kube-router")


def component(node: NodeSpec, daemon: str) -> str:
    """The name its pid file and log carry: run/<node>/<daemon>.pid, logs/<node>/<daemon>.log."""
    return f"{node.name}/{daemon}"


def components(nodes: Iterable[NodeSpec]) -> list[str]:
    return [component(n, d) for n in nodes for d in DAEMONS]


def cgroup_root(ctx: Context, node: NodeSpec) -> str:
    return f"{host.cgroup_parent(ctx)}/{node.name}"


def _ensure_node_cgroups(ctx: Context, node: NodeSpec) -> None:
    """The node's cgroup root (the kubelet's cgroupRoot) under the cluster's, in every hierarchy."""
    for h in host.v1_hierarchies():
        d = h / cgroup_root(ctx, node)
        d.mkdir(parents=True, exist_ok=True)
        if (h / "cpuset.cpus").exists():
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((d.parent / knob).read_text())


def write_kubeconfigs(ctx: Context, pki: Pki, api_ip: str) -> None:
    """Kubeconfigs naming the API server by the host's address (a node's 127.0.0.1 is its own)."""
    server = f"https://{api_ip}:{APISERVER_PORT}"
    pki.write_kubeconfig(ctx.kubeconfig(NODES_KUBE_PROXY), "kube-proxy", *pki.kube_proxy, server=server)
    pki.write_kubeconfig(ctx.kubeconfig(netpol.NODES_ADMIN_KUBECONFIG), "admin", *pki.admin, server=server)


def _start_runtime(ctx: Context, node: NodeSpec) -> None:
    d = node_dirs(ctx, node.name)
    for p in d.values():
        p.mkdir(parents=True, exist_ok=True)
    network.write_cni_conf(ctx, node.name, subnet=node.pod_cidr, gateway=node.pod_gateway, ip_masq=False)
    conf = d["config"] / "containerd.toml"
    conf.write_text(_containerd_config(ctx, node.name))
    name = component(node, "containerd")
    ctx.spawn(name, ["containerd", "--config", str(conf), "--log-level", "warn"], netns=node.netns)
    address = containerd_address(ctx, node.name)

    def up() -> bool:
        argv = ["ctr", "--address", address, "version"]
        return subprocess.run(argv, capture_output=True, timeout=5).returncode == 0

    wait_for(f"{name}", up, 30, ctx, name)
    pause_tar, _ = build(ImageSpec.load(HERE / "images" / "pause"), {}, ctx.cache, quiet=True)
    import_image(address, pause_tar, PAUSE_IMAGE)  # skipped when the node's disk has it already


def _start_agents(ctx: Context, pki: Pki, node: NodeSpec) -> None:
    """kubelet and kube-proxy of the node, in its namespace."""
    d = node_dirs(ctx, node.name)
    pki.ensure_node(node.name, node.ip)
    kubelet_kc = ctx.kubeconfig(f"kubelet-{node.name}")
    server = f"https://{host_ip()}:{APISERVER_PORT}"
    pki.write_kubeconfig(kubelet_kc, f"kubelet-{node.name}", *pki.node_client(node.name), server=server)
    _ensure_node_cgroups(ctx, node)
    kubelet_conf = write_json(d["config"] / "kubelet.yaml", _kubelet_config(ctx, pki, node.ip, node))
    labels = ",".join(f"{k}={v}" for k, v in node.labels.items())
    ctx.spawn(
        component(node, "kubelet"),
        [
            ctx.binary("kubelet"),
            f"--config={kubelet_conf}",
            f"--kubeconfig={kubelet_kc}",
            f"--root-dir={d['kubelet_root']}",
            f"--cert-dir={d['kubelet_root']}/pki",
            f"--hostname-override={node.name}",
            f"--node-ip={node.ip}",
            f"--node-labels={labels}",
            "--v=1",
        ],
        netns=node.netns,
    )
    proxy_conf = write_json(d["config"] / "kube-proxy.yaml", _kube_proxy_config(ctx, proxy_mode(), node))
    ctx.spawn(
        component(node, "kube-proxy"),
        [ctx.binary("kube-proxy"), f"--config={proxy_conf}", "--v=1"],
        netns=node.netns,
    )


def node_ready(ctx: Context, node: NodeSpec) -> bool:
    res = ctx.kubectl(
        "get",
        "node",
        node.name,
        "-o",
        "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
        check=False,
    )
    return res.stdout.strip() == "True"


def lease_renewed_since(ctx: Context, node: NodeSpec, since: float) -> bool:
    """Whether the node's kubelet renewed its Lease after `since` (epoch seconds): a heartbeat of the
    kubelet now running, not one its predecessor left."""
    res = ctx.kubectl("-n", "kube-node-lease", "get", "lease", node.name, "-o", "jsonpath={.spec.renewTime}",
                      check=False)  # fmt: skip
    return parse_micro_time(res.stdout.strip()) > since


def parse_micro_time(text: str) -> float:
    """Epoch seconds of a MicroTime (2026-12-05T11:21:09.123456Z); 0 for anything else."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


def _wait_ready(ctx: Context, node: NodeSpec, since: float = 0.0, timeout: float = 120) -> None:
    """Until the Node is Ready on a heartbeat sent after `since`: right after a power loss the API server
    still shows the dead kubelet's Ready for the node-monitor grace period."""
    wait_for(f"node {node.name} to be Ready",
             lambda: lease_renewed_since(ctx, node, since) and node_ready(ctx, node), timeout, ctx,
             component(node, "kubelet"), interval=0.5)  # fmt: skip
    ctx.ensure_alive(component(node, "kube-proxy"))


def start(ctx: Context, pki: Pki, nodes: list[NodeSpec]) -> None:
    """Every node, then CoreDNS; returns when every Node is Ready and enforces NetworkPolicies."""
    save_layout(ctx, nodes)
    nodenet.ensure_host_bridge()
    write_kubeconfigs(ctx, pki, host_ip())
    for n in nodes:
        set_power_state(ctx, n, PowerState.RUNNING)
        nodenet.plug_in(n, nodes)
        _start_runtime(ctx, n)
    for n in nodes:
        _start_agents(ctx, pki, n)
    for n in nodes:
        _wait_ready(ctx, n)
    for n in nodes:
        netpol.start(ctx, n)  # reads the Node object, so after it registered
    addons.start_dns(ctx, node_name=None)
    zones = ", ".join(f"{n.name} ({n.zone})" for n in nodes)
    log(f"{len(nodes)} nodes Ready: {zones}")


# --- the power verbs -------------------------------------------------------------------------------------


def node_processes(ctx: Context, node: NodeSpec) -> list[int]:
    """Shims (and any daemon that lost its pid file) naming the node's own directories."""
    marks = (str(node_dirs(ctx, node.name)["containerd_state"]), str(node_state_dir(ctx, node)) + "/")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in line for m in marks):
            found.append(int(entry.name))
    return found


def container_pids(ctx: Context, node: NodeSpec) -> set[int]:
    pids: set[int] = set()
    for h in host.v1_hierarchies():
        top = h / cgroup_root(ctx, node)
        for d, _, _ in os.walk(top):
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(x) for x in (Path(d) / "cgroup.procs").read_text().split()}
    return {p for p in pids if _alive(p)}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_everything(ctx: Context, node: NodeSpec) -> None:
    """SIGKILL, no warning: the daemons, the shims, every container process of the node."""
    deadline = time.monotonic() + 15
    while True:
        pids = {ctx.pid_of(c) for c in components([node])} - {None}
        victims = (
            {p for p in pids if p is not None} | set(node_processes(ctx, node)) | container_pids(ctx, node)
        )
        if not victims:
            break
        if time.monotonic() > deadline:
            raise ClusterError(f"poweroff {node.name}: processes survived SIGKILL: {sorted(victims)}")
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for c in components([node]):
        (ctx.run / f"{c}.pid").unlink(missing_ok=True)


def _unmount_under(roots: list[Path]) -> None:
    for _ in range(3):
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split()[4].encode().decode("unicode_escape") for line in f]
        targets = [m for m in mounts if any(m == str(r) or m.startswith(str(r) + "/") for r in roots)]
        if not targets:
            return
        for m in sorted(set(targets), key=lambda p: p.count("/"), reverse=True):
            if subprocess.run(["umount", m], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", m], capture_output=True)


def _remove_container_cgroups(ctx: Context, node: NodeSpec) -> None:
    for h in host.v1_hierarchies():
        top = h / cgroup_root(ctx, node)
        for d, _, _ in sorted(os.walk(top), key=lambda w: len(Path(w[0]).parts), reverse=True):
            if Path(d) != top:
                with contextlib.suppress(OSError):
                    Path(d).rmdir()


def poweroff(ctx: Context, node: NodeSpec) -> None:
    next_state("poweroff", node.name, power_state(ctx, node))
    if nodenet.node_netns_exists(node):
        nodenet.set_link(node, up=False)
    _kill_everything(ctx, node)
    set_power_state(ctx, node, PowerState.POWERED_OFF)  # before the volumes' node is gone: the provisioner
    d = node_dirs(ctx, node.name)
    _unmount_under([d["containerd_state"].parent, d["kubelet_root"], d["containerd_root"]])
    nodenet.unplug(node)
    shutil.rmtree(d["containerd_state"].parent, ignore_errors=True)  # its /run
    shutil.rmtree(d["cni_ipam"], ignore_errors=True)  # address leases of pods that are gone
    _remove_container_cgroups(ctx, node)
    log(f"{node.name} is powered off (its pods are gone; the API server learns it from missed heartbeats)")


def poweron(ctx: Context, node: NodeSpec) -> None:
    next_state("poweron", node.name, power_state(ctx, node))
    nodes = load_layout(ctx)
    pki = Pki(ctx.pki)
    booted = time.time()
    nodenet.plug_in(node, nodes)
    _start_runtime(ctx, node)
    _start_agents(ctx, pki, node)
    set_power_state(ctx, node, PowerState.RUNNING)
    _wait_ready(ctx, node, since=booted)
    netpol.start(ctx, node)
    log(f"{node.name} is powered on and Ready")


def partition(ctx: Context, node: NodeSpec) -> None:
    next_state("partition", node.name, power_state(ctx, node))
    nodenet.set_link(node, up=False)
    set_power_state(ctx, node, PowerState.PARTITIONED)
    log(f"{node.name} is cut off the network (its processes run on)")


def heal(ctx: Context, node: NodeSpec) -> None:
    next_state("heal", node.name, power_state(ctx, node))
    nodenet.set_link(node, up=True)
    set_power_state(ctx, node, PowerState.RUNNING)
    log(f"{node.name} is back on the network")


# --- stop and status --------------------------------------------------------------------------------------


def stop(ctx: Context, nodes: list[NodeSpec]) -> None:
    """Stop every node: kubelets first (they would restart the pods stopped next), then the rest; the
    pods themselves are stopped with the cluster's cgroup root (teardown.stop_pods)."""
    for n in nodes:
        ctx.stop_process(component(n, "kubelet"), timeout=10)
    for n in nodes:
        ctx.stop_process(component(n, "kube-proxy"), timeout=5)
        netpol.stop(ctx, n)


def stop_runtimes(ctx: Context, nodes: list[NodeSpec]) -> None:
    for n in nodes:
        ctx.stop_process(component(n, "containerd"), timeout=10)


def status_lines(ctx: Context) -> list[str]:
    lines = []
    for n in load_layout(ctx):
        alive = [d for d in DAEMONS if ctx.pid_of(component(n, d)) is not None]
        state = power_state(ctx, n).value
        if state == PowerState.RUNNING.value and not nodenet.link_up(n):
            state = "link down"
        daemons = ", ".join(alive) if alive else "no process"
        lines.append(f"  node {n.name}: {state}, zone {n.zone}, ip {n.ip}, pods {n.pod_cidr}; {daemons}")
    return lines
