"""The full profile's pod network on the host: the bridge, the CNI configuration containerd reads, and
finding and removing what pods and kube-proxy leave in it (pod netns, veths, iptables chains)."""

from __future__ import annotations

import ipaddress
import json
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any

from localkube.common import POD_CIDR, ClusterError, Context, node_dirs, write_json

BRIDGE = "localkube0"
POD_NET = ipaddress.IPv4Network(POD_CIDR)
BRIDGE_IP = str(next(POD_NET.hosts()))  # the pods' gateway; CoreDNS listens here
CNI_BIN = "/usr/lib/cni"
NETNS_DIR = Path("/run/netns")  # containerd 1.6 puts pod netns here; not configurable
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")
OUR_CHAIN_PREFIXES = ("KUBE-", "CNI-", "LOCALKUBE-")


def ensure_bridge() -> None:
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


def write_cni_conf(
    ctx: Context,
    node: str | None = None,
    subnet: str = POD_CIDR,
    gateway: str = BRIDGE_IP,
    ip_masq: bool = True,
) -> None:
    """The CNI configuration of the single node, or of one node of many (its own pod slice, and no
    masquerading by the bridge plugin: that would hide a pod's address from pods on other nodes, and
    from NetworkPolicies; the node masquerades only what leaves the cluster, nodenet.py)."""
    d = node_dirs(ctx, node)
    for old in d["cni_conf"].glob("*"):
        old.unlink()
    write_json(
        d["cni_conf"] / "10-localkube.conflist",
        {
            "cniVersion": "1.0.0",
            "name": "localkube",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": ip_masq,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(d["cni_ipam"]),
                        "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
    )


# --- what pods and kube-proxy leave behind -------------------------------------------------------------


def our_netns(networks: Sequence[IPv4Network] = (POD_NET,), include_empty: bool = True) -> list[str]:
    """Pod netns of ours: `cni-*` whose interfaces hold an address in one of `networks` (the pod
    CIDR, or the slices of a multi-node cluster's nodes), or that hold nothing but loopback any more
    (their veth went with the bridge) unless `include_empty` is false (one node's pods of many: an empty
    netns may be another node's pod being set up)."""
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
        addrs = [
            a.get("local", "")
            for link in links
            for a in link.get("addr_info", [])
            if a.get("family") == "inet"
        ]
        non_lo = [link for link in links if link.get("ifname") != "lo"]
        in_cidr = any(ipaddress.ip_address(a) in net for a in addrs if a for net in networks)
        if in_cidr or (include_empty and not non_lo):
            ours.append(entry.name)
    return ours


def delete_netns(names: list[str]) -> None:
    for ns in names:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        (NETNS_DIR / ns).unlink(missing_ok=True)


def links() -> list[dict[str, Any]]:
    res = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True)
    try:
        return list(json.loads(res.stdout or "[]"))
    except ValueError:
        return []


def our_links() -> list[str]:
    return [
        link["ifname"] for link in links() if link.get("ifname") == BRIDGE or link.get("master") == BRIDGE
    ]


def delete_links() -> None:
    for name in sorted(our_links(), key=lambda n: n == BRIDGE):  # veths first, the bridge last
        subprocess.run(["ip", "link", "delete", name], capture_output=True)


def iptables_cmds() -> list[str]:
    return [c for c in ("iptables", "ip6tables") if shutil.which(c) and shutil.which(f"{c}-save")]


def _ours(chain: str) -> bool:
    return chain.startswith(OUR_CHAIN_PREFIXES)


def iptables_state(cmd: str, table: str) -> tuple[list[str], list[list[str]]]:
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


def clean_iptables() -> None:
    """Drop the rules in the built-in chains that jump to KUBE-*/CNI-* chains, then those chains."""
    for cmd in iptables_cmds():
        for table in IPTABLES_TABLES:
            chains, jumps = iptables_state(cmd, table)
            for rule in jumps:
                line = shlex.split(" ".join(rule))  # iptables-save quotes comments
                subprocess.run([cmd, "-w", "-t", table, "-D", *line], capture_output=True)
            for chain in chains:
                subprocess.run([cmd, "-w", "-t", table, "-F", chain], capture_output=True)
            for chain in chains:
                subprocess.run([cmd, "-w", "-t", table, "-X", chain], capture_output=True)


def clean_nftables() -> None:
    """Drop the tables kube-proxy's nftables mode keeps (one per address family)."""
    if shutil.which("nft"):
        for family in ("ip", "ip6"):
            subprocess.run(["nft", "delete", "table", family, "kube-proxy"], capture_output=True)
