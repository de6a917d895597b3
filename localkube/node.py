"""The real node of the `full` profile: containerd + runc, a CNI bridge, kubelet, kube-proxy, CoreDNS,
and the storage provisioner; plus the teardown that leaves nothing behind.

Order cluster.py calls: missing_prereqs() → prepare_host(ctx) → (control plane) → start(ctx, pki)
→ install_storage(ctx); stop(ctx) → (control plane stop) → cleanup_leftovers(ctx).

Everything this node creates on the host is recognisable as ours, so teardown removes exactly that:
- processes: whose command line names our state or run directory (or our provisioner script);
- cgroups: everything under /localkube (another state directory: /localkube-<hash>) in each cgroup
  hierarchy (the kubelet's cgroupRoot);
- mounts: everything under the state directory, the run directory and our pods' netns files;
- network: the bridge BRIDGE, its veths, netns `cni-*` holding a pod-CIDR address, iptables chains
  KUBE-* and CNI-* and the rules that jump to them.
This machine's PID 1 does not reap, and container cgroups are outside the session's cgroup, so
nothing of this goes away by itself when the processes are killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from common import (
    CLUSTER_DNS_IP,
    CLUSTER_DOMAIN,
    DEFAULT_STATE,
    HERE,
    NODE_NAME,
    POD_CIDR,
    ClusterError,
    Context,
    host_ip,
    log,
    wait_for,
)

# Debian packages the node needs (cluster.py installs them with --install; .ci/run too).
APT_PACKAGES = [
    "containerd", "runc", "containernetworking-plugins", "iptables", "conntrack", "debootstrap",
    "socat", "util-linux", "iproute2", "gcc", "libc6-dev",
]
# what must exist -> the package that provides it
_CNI_PKG = "containernetworking-plugins"
_PREREQ_FILES = {
    "containerd": "containerd", "ctr": "containerd", "runc": "runc",
    "/usr/lib/cni/bridge": _CNI_PKG, "/usr/lib/cni/host-local": _CNI_PKG,
    "/usr/lib/cni/portmap": _CNI_PKG, "/usr/lib/cni/loopback": _CNI_PKG,
    "iptables": "iptables", "iptables-save": "iptables", "conntrack": "conntrack",
    "debootstrap": "debootstrap",
    "socat": "socat", "nsenter": "util-linux", "unshare": "util-linux", "ip": "iproute2", "gcc": "gcc",
    "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev",
}

COMPONENTS = ("containerd", "kubelet", "kube-proxy", "coredns", "provisioner")
# Host ports the node's components listen on (cluster.py checks they are free before `up`).
PORTS = {10250: "kubelet", 10248: "kubelet healthz", 10249: "kube-proxy metrics", 10256: "kube-proxy healthz",
         18180: "coredns health", 18181: "coredns ready"}

RUN_DIR = Path("/run/pg-operator-localkube")
BRIDGE = "localkube0"
POD_NET = ipaddress.ip_network(POD_CIDR)
BRIDGE_IP = str(next(POD_NET.hosts()))  # the pods' gateway; CoreDNS listens here
DEFAULT_CGROUP_PARENT = "localkube"
CGROUP_V1 = Path("/sys/fs/cgroup")
PAUSE_IMAGE = "localkube.local/pause:1"
STORAGE_CLASS = "standard"
PROVISIONER = "localkube.local/hostpath"
CNI_BIN = "/usr/lib/cni"
NETNS_DIR = Path("/run/netns")  # containerd 1.6 puts pod netns here; not configurable
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")
OUR_CHAIN_PREFIXES = ("KUBE-", "CNI-")

# Kernel settings the kubelet insists on (protectKernelDefaults: it refuses to start otherwise, and
# never rewrites them itself). Setting them here, once and visibly, is the deliberate choice.
KUBELET_SYSCTLS = {
    "vm.overcommit_memory": "1", "vm.panic_on_oom": "0", "kernel.panic": "10", "kernel.panic_on_oops": "1",
    "kernel.keys.root_maxkeys": "1000000", "kernel.keys.root_maxbytes": "25000000",
}
NETWORK_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    # Pod → Service → pod on the same bridge needs the bridge's traffic to pass iptables (kube-proxy's
    # DNAT and its reverse); the kernel here has br_netfilter built in.
    "net.bridge.bridge-nf-call-iptables": "1", "net.bridge.bridge-nf-call-ip6tables": "1",
}
MINIMUM_SYSCTLS = {"fs.inotify.max_user_instances": 1024, "fs.inotify.max_user_watches": 524288}


def _images() -> ModuleType:
    """localkube/images/build.py, loaded under a name no installed package can shadow (`build` is
    also PyPA's build tool)."""
    name = "localkube_image_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / "images" / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def ensure_images(ctx: Context, names: Sequence[str]) -> None:
    """Build (cached) and import image references into the running node's containerd, e.g.
    ["localkube.local/base:bookworm", "localhost/pg-operator/postgres:16.15"]."""
    _images().ensure_images(ctx, names)


# --- paths -----------------------------------------------------------------------------------------


def containerd_address(ctx: Context) -> str:
    return str(RUN_DIR / "containerd" / "containerd.sock")


def _dirs(ctx: Context) -> dict[str, Path]:
    s = ctx.state
    return {
        "containerd_root": s / "containerd", "containerd_state": RUN_DIR / "containerd",
        "containerd_opt": s / "containerd-opt",
        "cni_conf": s / "cni" / "net.d", "cni_ipam": s / "cni" / "ipam",
        "kubelet_root": s / "kubelet", "kubelet_plugins": s / "kubelet-plugins", "pod_logs": s / "pod-logs",
        "config": s / "node", "volumes": s / "volumes",
    }


# --- prerequisites and host preparation ---------------------------------------------------------------


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
        if "cgroups" in missing else [])


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


def prepare_host(ctx: Context) -> None:
    """Clear what an earlier node left (it may have died without `down`), then the kernel settings
    and cgroups the node needs; safe to repeat."""
    if os.geteuid() != 0:
        raise ClusterError("the full profile runs containers and must run as root")
    cleanup_leftovers(ctx)
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
    for d in _dirs(ctx).values():
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
    _write_json(record, values)


def _restore_sysctls(ctx: Context) -> None:
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


def _v1_hierarchies() -> list[Path]:
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
    for h in _v1_hierarchies():
        d = h / cgroup_parent(ctx)
        d.mkdir(exist_ok=True)
        if (h / "cpuset.cpus").exists():  # a cpuset child is unusable until it has cpus and mems
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((h / knob).read_text())


# --- start -----------------------------------------------------------------------------------------------


def _write_json(path: Path, doc: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _ensure_bridge() -> None:
    """The pods' bridge, made before any pod so CoreDNS can listen on its address from the start
    (the CNI bridge plugin adopts an existing bridge with the right gateway address)."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    addrs = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", BRIDGE], capture_output=True, text=True)
    if f" {BRIDGE_IP}/" not in addrs.stdout:
        _ip("addr", "add", f"{BRIDGE_IP}/{POD_NET.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)} failed: {res.stderr.strip()}")


def _write_cni_conf(ctx: Context) -> None:
    d = _dirs(ctx)
    for old in d["cni_conf"].glob("*"):
        old.unlink()
    _write_json(d["cni_conf"] / "10-localkube.conflist", {
        "cniVersion": "1.0.0",
        "name": "localkube",
        "plugins": [
            {
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                "ipam": {
                    "type": "host-local", "dataDir": str(d["cni_ipam"]),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": BRIDGE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    })


def _containerd_config(ctx: Context) -> str:
    d = _dirs(ctx)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{d['containerd_root']}"
state = "{d['containerd_state']}"
# Snapshotters that cannot work here only log errors at every start.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{containerd_address(ctx)}"

[ttrpc]
  address = "{d['containerd_state']}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d['containerd_opt']}"

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
  BinaryName = "{shutil.which('runc') or 'runc'}"

[{cri}.cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{d['cni_conf']}"
  max_conf_num = 1
"""


def _kubelet_config(ctx: Context, pki: Any, node_ip: str) -> dict[str, Any]:
    d = _dirs(ctx)
    crt, key = pki.kubelet_serving
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This VM has cgroup v1 (hybrid); kubelet >= 1.35 refuses v1 unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # Pods' cgroups under /localkube in every hierarchy: ours alone to remove on teardown.
        "cgroupRoot": f"/{cgroup_parent(ctx)}",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{containerd_address(ctx)}",
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
        "authorization": {"mode": "Webhook", "webhook": {"cacheAuthorizedTTL": "30s",
                                                          "cacheUnauthorizedTTL": "5s"}},
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "/etc/resolv.conf",
        # The kernel settings the kubelet wants are set by prepare_host(); with this the kubelet
        # verifies them instead of silently rewriting the host's kernel parameters.
        "protectKernelDefaults": True,
        "makeIPTablesUtilChains": True,
        "hairpinMode": "hairpin-veth",
        "maxPods": 110,
        "podPidsLimit": 4096,
        "failSwapOn": False,
        # A dev box's disk and memory are shared with builds: evict only when really out of room.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%", "imagefs.inodesFree": "1%"},
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


def _kube_proxy_config(ctx: Context) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "hostnameOverride": NODE_NAME,
        "clientConnection": {"kubeconfig": str(ctx.kubeconfig("kube-proxy"))},
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        # Leave the host's conntrack table sizes and timeouts alone (0 = do not touch).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"masqueradeAll": False, "syncPeriod": "30s", "minSyncPeriod": "1s"},
        "detectLocalMode": "ClusterCIDR",
        # NodePorts on the node's own address only, not on every address of the host.
        "nodePortAddresses": ["primary"],
    }


def start(ctx: Context, pki: Any) -> None:
    """containerd, the pause image, kubelet, kube-proxy and CoreDNS; returns when the Node is Ready."""
    images = _images()
    d = _dirs(ctx)
    for p in d.values():
        p.mkdir(parents=True, exist_ok=True)
    node_ip = host_ip()
    _ensure_bridge()
    _write_cni_conf(ctx)
    conf = d["config"] / "containerd.toml"
    conf.write_text(_containerd_config(ctx))
    ctx.spawn("containerd", ["containerd", "--config", str(conf), "--log-level", "warn"])
    address = containerd_address(ctx)

    def containerd_up() -> bool:
        return subprocess.run(["ctr", "--address", address, "version"], capture_output=True,
                              timeout=5).returncode == 0

    wait_for("containerd", containerd_up, 30, ctx, "containerd")
    pause_tar, _ = images.build(images.ImageSpec.load(HERE / "images" / "pause"), {}, ctx.cache, quiet=True)
    images.import_image(address, pause_tar, PAUSE_IMAGE)

    kubelet_kc = ctx.kubeconfig("kubelet")
    pki.write_kubeconfig(kubelet_kc, "kubelet", *pki.kubelet_client)
    proxy_kc = ctx.kubeconfig("kube-proxy")
    pki.write_kubeconfig(proxy_kc, "kube-proxy", *pki.kube_proxy)
    kubelet_conf = _write_json(d["config"] / "kubelet.yaml", _kubelet_config(ctx, pki, node_ip))
    ctx.spawn("kubelet", [
        ctx.binary("kubelet"), f"--config={kubelet_conf}", f"--kubeconfig={kubelet_kc}",
        f"--root-dir={d['kubelet_root']}", f"--cert-dir={d['kubelet_root']}/pki",
        f"--hostname-override={NODE_NAME}", f"--node-ip={node_ip}", "--v=1",
    ])
    proxy_conf = _write_json(d["config"] / "kube-proxy.yaml", _kube_proxy_config(ctx))
    ctx.spawn("kube-proxy", [ctx.binary("kube-proxy"), f"--config={proxy_conf}", "--v=1"])

    def node_ready() -> bool:
        res = ctx.kubectl("get", "node", NODE_NAME, "-o",
                          "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return res.stdout.strip() == "True"

    wait_for(f"node {NODE_NAME} to be Ready", node_ready, 90, ctx, "kubelet", interval=0.5)
    ctx.ensure_alive("kube-proxy")
    start_dns(ctx)


# --- cluster DNS -----------------------------------------------------------------------------------------
# CoreDNS (built from its Go module, localkube/modules/coredns) runs on the host and listens on the
# bridge address; the `kube-dns` Service in kube-system has the usual ClusterIP and an EndpointSlice
# pointing at that address, so pods use the standard clusterDNS IP through kube-proxy. On the host it
# needs no image, starts in well under a second and is not subject to pod scheduling.


def _corefile(ctx: Context) -> str:
    return f""".:53 {{
    bind {BRIDGE_IP}
    health 127.0.0.1:18180
    ready 127.0.0.1:18181
    errors
    cache 5
    loadbalance
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {ctx.admin_kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
}}
"""


def _dns_objects() -> str:
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    labels = {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
        "spec": {"clusterIP": CLUSTER_DNS_IP, "ports": [{**p, "targetPort": 53} for p in ports]},
    }
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kube-dns-host", "namespace": "kube-system", "labels": {
            "kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "localkube"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [BRIDGE_IP], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
        "ports": ports,
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, slice_]})


def start_dns(ctx: Context) -> None:
    corefile = _dirs(ctx)["config"] / "Corefile"
    corefile.write_text(_corefile(ctx))
    ctx.spawn("coredns", [ctx.binary("coredns"), "-conf", str(corefile)])

    def ready() -> bool:
        with urllib.request.urlopen("http://127.0.0.1:18181/ready", timeout=2) as r:
            return bool(r.status == 200)

    wait_for("CoreDNS to be ready", ready, 30, ctx, "coredns")
    ctx.kubectl("apply", "-f", "-", input=_dns_objects())


# --- storage ----------------------------------------------------------------------------------------------
# Why not kube-controller-manager's --enable-hostpath-provisioner: its PVs are hostPath volumes in
# 0750 root-owned directories, and the kubelet applies no fsGroup to hostPath, so a PostgreSQL pod
# running as uid 999 cannot write its data directory. Our provisioner (localkube/hostpath) makes
# `local` PVs instead — one directory per claim under <state>/volumes, node affinity to the node the
# scheduler picked (WaitForFirstConsumer) — and the kubelet gives `local` volumes the pod's fsGroup.
# It only talks to the API server, so it serves the kwok profile too (claims bind, nothing mounts).


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS,
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowVolumeExpansion": True,
    }


def install_storage(ctx: Context) -> None:
    """The default StorageClass `standard` and the provisioner that binds its claims."""
    script = HERE / "hostpath" / "provisioner.py"
    volumes = _dirs(ctx)["volumes"]
    volumes.mkdir(parents=True, exist_ok=True)
    if ctx.pid_of("provisioner") is None:
        ctx.spawn("provisioner", [
            sys.executable, str(script), "--state", str(ctx.state), "--volumes", str(volumes),
            "--provisioner", PROVISIONER, "--storage-class", STORAGE_CLASS,
        ])
    ctx.kubectl("apply", "-f", "-", input=json.dumps(storage_class()))
    ready = ctx.run / "provisioner.ready"
    wait_for("the storage provisioner", ready.exists, 15, ctx, "provisioner")


def stop_storage(ctx: Context) -> None:
    ctx.stop_process("provisioner", timeout=5)
    (ctx.run / "provisioner.ready").unlink(missing_ok=True)


# --- stop and cleanup ------------------------------------------------------------------------------------


def stop(ctx: Context) -> None:
    """Stop the node: pods first (so the shims reap them), then the daemons, then every trace."""
    stop_storage(ctx)
    ctx.stop_process("kubelet", timeout=10)  # first: it would restart the pods we stop next
    ctx.stop_process("kube-proxy", timeout=5)
    ctx.stop_process("coredns", timeout=5)
    _stop_pods(ctx)
    # containerd's metadata is not cleaned container by container (seconds per pod): the content
    # store under the state directory goes as a whole, and `up` re-imports images from the cache.
    ctx.stop_process("containerd", timeout=10)
    try:
        _clean(ctx)
    except ClusterError as e:  # cleanup_leftovers(), after the control plane, reports it and stops
        log(f"warning: {e}")  # cluster.py from deleting the state directory


def cleanup_leftovers(ctx: Context) -> None:
    """Remove what an earlier node left, whether it was stopped or died; a no-op on a clean host.
    Raises ClusterError when a mount under our directories cannot be removed."""
    stop(ctx)
    _clean(ctx)


def _clean(ctx: Context) -> None:
    _kill_our_processes(ctx)
    _kill_cgroup_processes(ctx, signal.SIGKILL)
    _wait_cgroups_empty(ctx, 5)
    ours = _our_netns()
    _unmount_ours(ctx, ours)
    for ns in ours:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        (NETNS_DIR / ns).unlink(missing_ok=True)
    _delete_links()
    _clean_iptables()
    _remove_cgroups(ctx)
    d = _dirs(ctx)
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
    _restore_sysctls(ctx)
    remaining = _mount_leftovers(ctx)
    if remaining:
        raise ClusterError("could not unmount (the state directory is kept so nothing under them is "
                           "deleted):\n  " + "\n  ".join(remaining))


def _stop_pods(ctx: Context) -> None:
    """SIGTERM every container process (databases shut down cleanly), SIGKILL what is left after 5 s."""
    _kill_cgroup_processes(ctx, signal.SIGTERM)
    if not _wait_cgroups_empty(ctx, 5):
        _kill_cgroup_processes(ctx, signal.SIGKILL)
        _wait_cgroups_empty(ctx, 5)


# processes --------------------------------------------------------------------------------------------

_OUR_EXES = {"kubelet", "kube-proxy", "containerd", "containerd-shim", "containerd-shim-runc-v1",
             "containerd-shim-runc-v2", "coredns"}


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
    for h in _v1_hierarchies():
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
    roots = _mount_roots(ctx, _our_netns())
    return [f"mount {m}" for m in _mountpoints() if _ours_to_unmount(m, roots)]


# network ------------------------------------------------------------------------------------------------


def _our_netns() -> list[str]:
    """Pod netns of ours: `cni-*` whose interfaces hold a pod-CIDR address, or that hold nothing
    but loopback any more (their veth went with the bridge)."""
    if not NETNS_DIR.is_dir():
        return []
    ours = []
    for entry in sorted(NETNS_DIR.iterdir()):
        if not entry.name.startswith("cni-"):
            continue
        res = subprocess.run(["ip", "-n", entry.name, "-j", "addr"], capture_output=True, text=True)
        try:
            links = json.loads(res.stdout or "[]")
        except ValueError:
            links = []
        addrs = [a.get("local", "") for link in links for a in link.get("addr_info", [])
                 if a.get("family") == "inet"]
        non_lo = [link for link in links if link.get("ifname") != "lo"]
        in_cidr = any(ipaddress.ip_address(a) in POD_NET for a in addrs if a)
        if in_cidr or not non_lo:
            ours.append(entry.name)
    return ours


def _links() -> list[dict[str, Any]]:
    res = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True)
    try:
        return list(json.loads(res.stdout or "[]"))
    except ValueError:
        return []


def _our_links() -> list[str]:
    return [link["ifname"] for link in _links()
            if link.get("ifname") == BRIDGE or link.get("master") == BRIDGE]


def _delete_links() -> None:
    for name in sorted(_our_links(), key=lambda n: n == BRIDGE):  # veths first, the bridge last
        subprocess.run(["ip", "link", "delete", name], capture_output=True)


def _iptables_cmds() -> list[str]:
    return [c for c in ("iptables", "ip6tables") if shutil.which(c) and shutil.which(f"{c}-save")]


def _ours(chain: str) -> bool:
    return chain.startswith(OUR_CHAIN_PREFIXES)


def _iptables_state(cmd: str, table: str) -> tuple[list[str], list[list[str]]]:
    """(our chains, rules in any chain that jump to one of ours) of one table."""
    res = subprocess.run([f"{cmd}-save", "-t", table], capture_output=True, text=True)
    chains, jumps = [], []
    for line in res.stdout.splitlines():
        if line.startswith(":") and _ours(line[1:].split()[0]):
            chains.append(line[1:].split()[0])
        elif line.startswith("-A "):
            parts = line.split()
            target = parts[parts.index("-j") + 1] if "-j" in parts else ""
            if _ours(target) and not _ours(parts[1]):
                jumps.append(parts[1:])
    return chains, jumps


def _clean_iptables() -> None:
    """Drop the rules in the built-in chains that jump to KUBE-*/CNI-* chains, then those chains."""
    import shlex

    for cmd in _iptables_cmds():
        for table in IPTABLES_TABLES:
            chains, jumps = _iptables_state(cmd, table)
            for rule in jumps:
                line = shlex.split(" ".join(rule))  # iptables-save quotes comments
                subprocess.run([cmd, "-w", "-t", table, "-D", *line], capture_output=True)
            for chain in chains:
                subprocess.run([cmd, "-w", "-t", table, "-F", chain], capture_output=True)
            for chain in chains:
                subprocess.run([cmd, "-w", "-t", table, "-X", chain], capture_output=True)


# leftovers ----------------------------------------------------------------------------------------------


def leftovers(ctx: Context) -> list[str]:
    """What of a node is still on this host: an empty list after a clean `down`."""
    found = [f"process {pid}: {' '.join(argv)[:160]}" for pid, argv in _our_processes(ctx)]
    found += [f"container process {pid}" for pid in sorted(_live(_cgroup_pids(ctx)))]
    found += _mount_leftovers(ctx)
    found += [f"netns {ns}" for ns in _our_netns()]
    found += [f"link {name}" for name in _our_links()]
    for cmd in _iptables_cmds():
        for table in IPTABLES_TABLES:
            chains, jumps = _iptables_state(cmd, table)
            found += [f"{cmd} -t {table} chain {c}" for c in chains]
            found += [f"{cmd} -t {table} rule {' '.join(r)}" for r in jumps]
    found += [f"cgroup {d}" for d in _our_cgroup_dirs(ctx)]
    return found
