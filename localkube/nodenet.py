"""The network of a multi-node full profile (layout in topology.py): the host bridge the nodes plug into,
each node's network namespace with its link, routes and kernel settings, cutting and restoring a node's
link, and finding what of it is left on the host.

A node's namespace holds everything a machine's network stack would: its link (eth0), its pods' bridge
(made by the CNI bridge plugin when the first pod starts), kube-proxy's and kube-router's tables and
ipsets. Deleting the namespace (poweroff, teardown) drops all of that at once, as a machine's reboot does.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from pathlib import Path

from localkube import network
from localkube.common import ClusterError
from localkube.topology import (
    CLUSTER_POD_CIDR,
    HOST_NODE_IP,
    HOST_POD_FACING_IP,
    NODE_BRIDGE,
    NODE_NETWORK,
    NODE_PREFIX,
    NodeSpec,
)

NAT_CHAIN = "LOCALKUBE-NODES"  # the host's masquerading of what nodes send out of the node network

# Per network namespace since kernel 5.3 (br_netfilter's included): every node sets its own.
NODE_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.bridge.bridge-nf-call-iptables": "1",
    "net.bridge.bridge-nf-call-ip6tables": "1",
}


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res


def in_node(node: NodeSpec, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command in the node's network namespace (and only that: the mount namespace is the host's)."""
    return _run("nsenter", f"--net={network.NETNS_DIR / node.netns}", "--", *argv, check=check)


def _link_exists(name: str) -> bool:
    return _run("ip", "link", "show", name, check=False).returncode == 0


def ensure_host_bridge() -> None:
    """The bridge the nodes plug into, with the host's addresses on it and the NAT for what leaves."""
    if not _link_exists(NODE_BRIDGE):
        _run("ip", "link", "add", NODE_BRIDGE, "type", "bridge")
    have = _run("ip", "-4", "-o", "addr", "show", "dev", NODE_BRIDGE).stdout
    for addr in (f"{HOST_NODE_IP}/{NODE_NETWORK.prefixlen}", f"{HOST_POD_FACING_IP}/32"):
        if f" {addr} " not in have:
            _run("ip", "addr", "add", addr, "dev", NODE_BRIDGE)
    _run("ip", "link", "set", NODE_BRIDGE, "up")
    if _run("iptables", "-w", "-t", "nat", "-S", NAT_CHAIN, check=False).returncode != 0:
        _run("iptables", "-w", "-t", "nat", "-N", NAT_CHAIN)
        _run("iptables", "-w", "-t", "nat", "-A", "POSTROUTING", "-j", NAT_CHAIN)
        net = str(NODE_NETWORK)
        _run("iptables", "-w", "-t", "nat", "-A", NAT_CHAIN, "-s", net, "!", "-d", net, "-j", "MASQUERADE")


def node_netns_exists(node: NodeSpec) -> bool:
    return (network.NETNS_DIR / node.netns).exists()


def plug_in(node: NodeSpec, nodes: list[NodeSpec]) -> None:
    """Make the node's namespace and link as a booting machine finds them: an address on the node
    network, routes to the other nodes' pod slices, forwarding on. Safe to repeat."""
    if not node_netns_exists(node):
        _run("ip", "netns", "add", node.netns)
    if not _link_exists(node.host_veth):
        peer = f"{node.host_veth}p"
        _run("ip", "link", "add", node.host_veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", peer, "netns", node.netns)
        in_node(node, "ip", "link", "set", peer, "name", "eth0")
    _run("ip", "link", "set", node.host_veth, "master", NODE_BRIDGE, "up")
    in_node(node, "ip", "link", "set", "lo", "up")
    addrs = in_node(node, "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
    if f" {node.ip}/" not in addrs:
        in_node(node, "ip", "addr", "add", f"{node.ip}/{NODE_NETWORK.prefixlen}", "dev", "eth0")
    in_node(node, "ip", "link", "set", "eth0", "up")
    in_node(node, "ip", "route", "replace", "default", "via", HOST_NODE_IP)
    for other in nodes:
        if other.name != node.name:
            in_node(node, "ip", "route", "replace", other.pod_cidr, "via", other.ip)
    _run("ip", "route", "replace", node.pod_cidr, "via", node.ip, "dev", NODE_BRIDGE)
    for name, value in NODE_SYSCTLS.items():
        path = "/proc/sys/" + name.replace(".", "/")
        # /proc/sys/net shows the namespace of the process that opens it: write from inside.
        in_node(node, "sh", "-c", f"[ ! -e {path} ] || echo {value} > {path}")
    rule = ["POSTROUTING", "-s", node.pod_cidr, "!", "-d", CLUSTER_POD_CIDR, "-j", "MASQUERADE"]
    if in_node(node, "iptables", "-w", "-t", "nat", "-C", *rule, check=False).returncode != 0:
        in_node(node, "iptables", "-w", "-t", "nat", "-A", *rule)


def set_link(node: NodeSpec, up: bool) -> None:
    """Cut (or restore) the node's only link: nothing enters or leaves the node, its processes live on."""
    _run("ip", "link", "set", node.host_veth, "up" if up else "down")


def link_up(node: NodeSpec) -> bool:
    res = _run("ip", "-j", "link", "show", node.host_veth, check=False)
    try:
        return "UP" in json.loads(res.stdout)[0].get("flags", [])
    except (ValueError, LookupError):
        return False


def pod_netns_of(node: NodeSpec) -> list[str]:
    """The pod netns holding an address of the node's pod slice."""
    return network.our_netns([ipaddress.IPv4Network(node.pod_cidr)], include_empty=False)


def unplug(node: NodeSpec) -> None:
    """Remove the node's pods' netns and its own (its link, bridge, tables and ipsets go with it)."""
    network.delete_netns(pod_netns_of(node))
    if node_netns_exists(node):
        _run("ip", "netns", "delete", node.netns, check=False)
        (network.NETNS_DIR / node.netns).unlink(missing_ok=True)
    if _link_exists(node.host_veth):
        _run("ip", "link", "delete", node.host_veth, check=False)


# --- what a multi-node cluster leaves on the host ----------------------------------------------------


def our_node_netns() -> list[str]:
    if not network.NETNS_DIR.is_dir():
        return []
    return sorted(e.name for e in network.NETNS_DIR.iterdir() if e.name.startswith(NODE_PREFIX))


def our_links() -> list[str]:
    return [
        link["ifname"]
        for link in network.links()
        if link.get("ifname") == NODE_BRIDGE or link.get("master") == NODE_BRIDGE
    ]


def remove_leftovers() -> None:
    """Node namespaces, then their links and the host bridge (routes via it go with it)."""
    for ns in our_node_netns():
        _run("ip", "netns", "delete", ns, check=False)
        Path(network.NETNS_DIR / ns).unlink(missing_ok=True)
    for name in sorted(our_links(), key=lambda n: n == NODE_BRIDGE):
        _run("ip", "link", "delete", name, check=False)
