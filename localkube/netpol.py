"""NetworkPolicy enforcement for the full profile: kube-router with only its firewall controller.

The bridge CNI gives pods addresses and kube-proxy serves Services; neither enforces NetworkPolicies.
kube-router (built from its Go module, localkube/modules/kube-router) runs on the host like CoreDNS, with
its BGP router and service proxy off: it watches pods, namespaces and NetworkPolicies and turns them into
iptables chains (KUBE-ROUTER-*, KUBE-POD-FW-*, KUBE-NWPLCY-*) and ipsets (KUBE-SRC-*, KUBE-DST-*). Bridged
pod-to-pod traffic reaches those chains because the node sets net.bridge.bridge-nf-call-iptables.

Why kube-router: it enforces with iptables and ipsets, which this kernel has (the nftables `queue`
statement that sigs.k8s.io/kube-network-policies needs is not built in here), and it runs beside an
existing CNI and kube-proxy. Traffic from the node itself to its pods is always admitted (kubelet probes,
and an operator run on the host), as the NetworkPolicy API specifies.
"""

from __future__ import annotations

import shutil
import subprocess

from localkube.common import NODE_NAME, SERVICE_CIDR, Context, wait_for
from localkube.topology import NodeSpec

NODES_ADMIN_KUBECONFIG = "nodes-admin"  # node.NODES_ADMIN: the admin kubeconfig naming the host's address

COMPONENT = "kube-router"
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-", "inet6:KUBE-", "TMP-")  # TMP-: left by an interrupted sync
TOP_CHAINS = ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT")


def component(node: NodeSpec | None = None) -> str:
    return f"{node.name}/{COMPONENT}" if node else COMPONENT


def argv(ctx: Context, node: NodeSpec | None = None) -> list[str]:
    """The single node's kube-router, or one node's of many (in its namespace: the API server by the
    host's address, the node's own name)."""
    kubeconfig = ctx.kubeconfig(NODES_ADMIN_KUBECONFIG) if node else ctx.admin_kubeconfig
    return [
        ctx.binary(COMPONENT),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node.name if node else NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        "--enable-cni=false",  # the bridge CNI configuration is ours (network.py)
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # No listener at all: its health and metrics servers would bind every address of the host.
        "--health-port=0",
        "--metrics-port=0",
        # Pods and policies are watched; the periodic full resync only repairs drift.
        "--iptables-sync-period=1m",
        "--v=1",
    ]


def _chains_installed(node: NodeSpec | None) -> bool:
    prefix = ["nsenter", f"--net=/run/netns/{node.netns}", "--"] if node else []
    res = subprocess.run([*prefix, "iptables-save", "-t", "filter"], capture_output=True, text=True)
    return all(f"-j {chain}" in res.stdout for chain in TOP_CHAINS)


def start(ctx: Context, node: NodeSpec | None = None) -> None:
    """Start the policy controller (of the single node, or of one node of many, in its namespace);
    returns once its chains hang off INPUT, FORWARD and OUTPUT."""
    name = component(node)
    if ctx.pid_of(name) is None:
        ctx.spawn(name, argv(ctx, node), netns=node.netns if node else None)
    wait_for(f"{name}'s network policy chains", lambda: _chains_installed(node), 60, ctx, name)


def stop(ctx: Context, node: NodeSpec | None = None) -> None:
    ctx.stop_process(component(node), timeout=5)


def our_ipsets() -> list[str]:
    if shutil.which("ipset") is None:
        return []
    res = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True)
    return [n for n in res.stdout.split() if n.startswith(IPSET_PREFIXES)]


def clean_ipsets() -> None:
    """Destroy kube-router's ipsets; run after the iptables rules that use them are gone."""
    for name in our_ipsets():
        subprocess.run(["ipset", "destroy", name], capture_output=True)
