"""The real node of the `full` profile: containerd + runc, kubelet and kube-proxy, their configuration,
and the node's start and stop (host set-up in host.py, the pod network in network.py, NetworkPolicy
enforcement in netpol.py, CoreDNS and storage in addons.py, what is left behind in teardown.py).

Order cli.py calls: host.missing_prereqs() → prepare_host(ctx) → (control plane) → start(ctx, pki)
→ addons.install_storage(ctx); stop(ctx) → (control plane stop) → cleanup_leftovers(ctx).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from localkube import addons, host, netpol, network, teardown
from localkube.common import (
    CLUSTER_DNS_IP,
    CLUSTER_DOMAIN,
    HERE,
    NODE_NAME,
    POD_CIDR,
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
from localkube.pki import Pki
from localkube.topology import CLUSTER_POD_CIDR, NodeSpec

COMPONENTS = ("containerd", "kubelet", "kube-proxy", "kube-router", "coredns", "provisioner")
# Host ports the node's components listen on (cli.py checks they are free before `up`).
PORTS = {
    10250: "kubelet",
    10248: "kubelet healthz",
    10249: "kube-proxy metrics",
    10256: "kube-proxy healthz",
    18180: "coredns health",
    18181: "coredns ready",
}

PAUSE_IMAGE = "localkube.local/pause:1"
# The kubeconfigs the nodes of a multi-node cluster use: in a node's network namespace 127.0.0.1 is the
# node's own loopback, so these name the API server by the host's address.
NODES_KUBE_PROXY = "nodes-kube-proxy"

# kube-proxy's mode. iptables writes the filter and nat tables in two commits: when a Service goes from
# no ready endpoint to one (a failover after a crash), a SYN sent between them is neither rejected nor
# NATed and hangs on its untranslated conntrack entry until the client's connect timeout
# (bench/results-failover.md, cause 3). nftables applies kube-proxy's whole table in one transaction, so
# it is the default; iptables stays selectable to reproduce what most clusters still run.
PROXY_MODES = ("nftables", "iptables")


def proxy_mode() -> str:
    mode = os.environ.get("PGOP_PROXY_MODE", "nftables")
    if mode not in PROXY_MODES:
        raise ClusterError(f"PGOP_PROXY_MODE={mode!r}: expected one of {', '.join(PROXY_MODES)}")
    return mode


def _containerd_config(ctx: Context, node: str | None = None) -> str:
    """containerd's configuration: of the single node, or of one node of many (its own root, state and
    socket: one containerd per node, as on real machines)."""
    d = node_dirs(ctx, node)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d["containerd_root"]}"
state = "{d["containerd_state"]}"
# Snapshotters that cannot work here only log errors at every start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{containerd_address(ctx, node)}"

[ttrpc]
  address = "{d["containerd_state"]}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d["containerd_opt"]}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # The VM lacks CAP_SYS_RESOURCE: a negative oom_score_adj fails inside runc.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  max_container_log_line_size = 16384

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{shutil.which("runc") or "runc"}"

[{cri}.cni]
  bin_dir = "{network.CNI_BIN}"
  conf_dir = "{d["cni_conf"]}"
  max_conf_num = 1
"""


def _kubelet_config(ctx: Context, pki: Pki, node_ip: str, spec: NodeSpec | None = None) -> dict[str, Any]:
    """The kubelet's configuration: of the single node, or of `spec`, one node of many (its own
    directories, runtime socket, serving certificate and cgroup root under the cluster's)."""
    name = spec.name if spec else None
    d = node_dirs(ctx, name)
    crt, key = pki.node_serving(spec.name) if spec else pki.kubelet_serving
    cgroup_root = f"/{host.cgroup_parent(ctx)}" + (f"/{spec.name}" if spec else "")
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This VM has cgroup v1 (hybrid); kubelet >= 1.35 refuses v1 unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # Pods' cgroups under /localkube in every hierarchy: ours alone to remove on teardown.
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{containerd_address(ctx, name)}",
        "address": node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(crt),
        "tlsPrivateKeyFile": str(key),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True, "cacheTTL": "30s"},
            "x509": {"clientCAFile": str(pki.ca_crt)},
        },
        "authorization": {
            "mode": "Webhook",
            "webhook": {"cacheAuthorizedTTL": "30s", "cacheUnauthorizedTTL": "5s"},
        },
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        # The kernel settings the kubelet wants are set by host.prepare(); with this the kubelet
        # verifies them instead of silently rewriting the host's kernel parameters.
        "protectKernelDefaults": True,
        "makeIPTablesUtilChains": True,
        "hairpinMode": "hairpin-veth",
        "maxPods": 110,
        "podPidsLimit": 4096,
        "failSwapOn": False,
        # A dev box's disk and memory are shared with builds: evict only when really out of room.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        "evictionPressureTransitionPeriod": "30s",
        # Our images are imported, not pullable: image GC must never delete them (100 disables it).
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "podLogsDir": str(d["pod_logs"]),
        "volumePluginDir": str(d["kubelet_plugins"]),
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "containerLogMaxSize": "10Mi",
        "containerLogMaxFiles": 2,
        "registerNode": True,
        "logging": {"format": "text"},
    }


def _kube_proxy_config(ctx: Context, mode: str, spec: NodeSpec | None = None) -> dict[str, Any]:
    """kube-proxy's configuration: of the single node, or of `spec` (in the node's network namespace, so
    its listeners on 127.0.0.1 and its tables are the node's own)."""
    kubeconfig = ctx.kubeconfig(NODES_KUBE_PROXY if spec else "kube-proxy")
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": mode,
        "clusterCIDR": CLUSTER_POD_CIDR if spec else POD_CIDR,
        "hostnameOverride": spec.name if spec else NODE_NAME,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        # Leave the host's conntrack table sizes and timeouts alone (0 = do not touch).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        mode: {"masqueradeAll": False, "syncPeriod": "30s", "minSyncPeriod": "1s"},
        "detectLocalMode": "ClusterCIDR",
        # NodePorts on the node's own address only, not on every address of the host.
        "nodePortAddresses": ["primary"],
    }


def start(ctx: Context, pki: Pki) -> None:
    """containerd, the pause image, kubelet, kube-proxy and CoreDNS; returns when the Node is Ready."""
    d = node_dirs(ctx)
    for p in d.values():
        p.mkdir(parents=True, exist_ok=True)
    node_ip = host_ip()
    network.ensure_bridge()
    network.write_cni_conf(ctx)
    conf = d["config"] / "containerd.toml"
    conf.write_text(_containerd_config(ctx))
    ctx.spawn("containerd", ["containerd", "--config", str(conf), "--log-level", "warn"])
    address = containerd_address(ctx)

    def containerd_up() -> bool:
        return (
            subprocess.run(
                ["ctr", "--address", address, "version"], capture_output=True, timeout=5
            ).returncode
            == 0
        )

    wait_for("containerd", containerd_up, 30, ctx, "containerd")
    pause_tar, _ = build(ImageSpec.load(HERE / "images" / "pause"), {}, ctx.cache, quiet=True)
    import_image(address, pause_tar, PAUSE_IMAGE)

    kubelet_kc = ctx.kubeconfig("kubelet")
    pki.write_kubeconfig(kubelet_kc, "kubelet", *pki.kubelet_client)
    proxy_kc = ctx.kubeconfig("kube-proxy")
    pki.write_kubeconfig(proxy_kc, "kube-proxy", *pki.kube_proxy)
    kubelet_conf = write_json(d["config"] / "kubelet.yaml", _kubelet_config(ctx, pki, node_ip))
    ctx.spawn(
        "kubelet",
        [
            ctx.binary("kubelet"),
            f"--config={kubelet_conf}",
            f"--kubeconfig={kubelet_kc}",
            f"--root-dir={d['kubelet_root']}",
            f"--cert-dir={d['kubelet_root']}/pki",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={node_ip}",
            "--v=1",
        ],
    )
    proxy_conf = write_json(d["config"] / "kube-proxy.yaml", _kube_proxy_config(ctx, proxy_mode()))
    ctx.spawn("kube-proxy", [ctx.binary("kube-proxy"), f"--config={proxy_conf}", "--v=1"])

    def node_ready() -> bool:
        res = ctx.kubectl(
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return res.stdout.strip() == "True"

    wait_for(f"node {NODE_NAME} to be Ready", node_ready, 90, ctx, "kubelet", interval=0.5)
    ctx.ensure_alive("kube-proxy")
    netpol.start(ctx)  # reads the Node object, so after it registered
    addons.start_dns(ctx)


def prepare_host(ctx: Context) -> None:
    """Clear what an earlier node left (it may have died without `down`), then the kernel settings
    and cgroups the node needs; safe to repeat."""
    if os.geteuid() != 0:
        raise ClusterError("the full profile runs containers and must run as root")
    cleanup_leftovers(ctx)
    host.prepare(ctx)


def stop(ctx: Context) -> None:
    """Stop the node: pods first (so the shims reap them), then the daemons, then every trace."""
    addons.stop_storage(ctx)
    ctx.stop_process("kubelet", timeout=10)  # first: it would restart the pods we stop next
    ctx.stop_process("kube-proxy", timeout=5)
    netpol.stop(ctx)
    ctx.stop_process("coredns", timeout=5)
    teardown.stop_pods(ctx)
    # containerd's metadata is not cleaned container by container (seconds per pod): the content
    # store under the state directory goes as a whole, and `up` re-imports images from the cache.
    ctx.stop_process("containerd", timeout=10)
    try:
        teardown.clean(ctx)
    except ClusterError as e:  # cleanup_leftovers(), after the control plane, reports it and stops
        log(f"warning: {e}")  # cli.py from deleting the state directory


def cleanup_leftovers(ctx: Context) -> None:
    """Remove what an earlier node left, whether it was stopped or died; a no-op on a clean host.
    Raises ClusterError when a mount under our directories cannot be removed."""
    stop(ctx)
    teardown.clean(ctx)
