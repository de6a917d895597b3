"""The full profile's node layout: how many real nodes (PGOP_FULL_NODES, default 1), their names, zones,
addresses and pod CIDR slices, and the power state of each. Pure, apart from reading and writing the
layout file in the state directory.

One node (the default) is the profile as it always was: the node's components run in the host's network
namespace, on the bridge network.py makes. With two or more, each node runs in a network namespace of its
own (nodenet.py), plugged into one host bridge:

    host  NODE_BRIDGE  10.245.0.1/24 (+ 10.244.0.1/32: CoreDNS and what pods call "the host")
      ├─ veth lkn1 ── netns localkube-node-1  eth0 10.245.0.11  pods 10.244.1.0/24  zone-a
      ├─ veth lkn2 ── netns localkube-node-2  eth0 10.245.0.12  pods 10.244.2.0/24  zone-b
      └─ ...
Every node routes the other nodes' pod slices to their node address on the bridge, and everything else
to the host.
"""

from __future__ import annotations

import ipaddress
import json
import string
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from localkube.common import ClusterError, Context, containerd_address

NODES_VARIABLE = "PGOP_FULL_NODES"
ZONES_VARIABLE = "PGOP_FULL_ZONES"
MAX_NODES = 9

CLUSTER_POD_CIDR = "10.244.0.0/16"  # every node's slice is a /24 of it (10.244.<index>.0/24)
NODE_NETWORK = ipaddress.ip_network("10.245.0.0/24")
HOST_NODE_IP = "10.245.0.1"  # the host on the node network: the nodes' default gateway
# The address the single node's bridge has always had (CoreDNS listens there, tests' S3 store too); with
# many nodes the host keeps it, on the node bridge, so pods find the host at the same address.
HOST_POD_FACING_IP = "10.244.0.1"
NODE_BRIDGE = "lknodes0"
NODE_PREFIX = "localkube-node-"
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"


class PowerState(Enum):
    """What `poweroff`, `partition`, `heal` and `poweron` move a node between."""

    RUNNING = "running"
    PARTITIONED = "partitioned"  # network cut, processes alive
    POWERED_OFF = "powered-off"  # processes killed, network namespace gone


@dataclass(frozen=True)
class NodeSpec:
    """One real node of a multi-node full profile."""

    name: str
    index: int
    zone: str
    ip: str
    pod_cidr: str

    @property
    def netns(self) -> str:
        return self.name

    @property
    def host_veth(self) -> str:
        """The host's end of the node's link (on NODE_BRIDGE); the node's end is eth0 in its netns."""
        return f"lkn{self.index}"

    @property
    def pod_gateway(self) -> str:
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    @property
    def labels(self) -> dict[str, str]:
        """The labels the kubelet registers (kubernetes.io/hostname it sets itself from the name)."""
        return {ZONE_LABEL: self.zone}


def zone_name(i: int) -> str:
    return f"zone-{string.ascii_lowercase[i]}"


def plan(count: int, zones: int | None = None) -> list[NodeSpec]:
    """The layout of `count` nodes spread round-robin over `zones` zones (default: one zone per node)."""
    if not 2 <= count <= MAX_NODES:
        raise ClusterError(f"{NODES_VARIABLE}={count}: a multi-node layout has 2 to {MAX_NODES} nodes")
    zones = count if zones is None else zones
    if not 1 <= zones <= count:
        raise ClusterError(f"{ZONES_VARIABLE}={zones}: expected 1 to {count} (the number of nodes)")
    hosts = list(NODE_NETWORK.hosts())
    return [
        NodeSpec(
            name=f"{NODE_PREFIX}{i}",
            index=i,
            zone=zone_name((i - 1) % zones),
            ip=str(hosts[9 + i]),  # .11, .12, ...: .1 is the host
            pod_cidr=f"10.244.{i}.0/24",
        )
        for i in range(1, count + 1)
    ]


def _positive_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise ClusterError(f"{name}={raw!r}: expected a whole number")
    return int(raw)


def requested_nodes(env: Mapping[str, str]) -> int:
    """PGOP_FULL_NODES: how many real nodes `up full` starts (1 to MAX_NODES, default 1)."""
    count = _positive_int(env, NODES_VARIABLE, 1)
    assert count is not None
    if not 1 <= count <= MAX_NODES:
        raise ClusterError(f"{NODES_VARIABLE}={count}: expected 1 to {MAX_NODES}")
    return count


def requested_layout(env: Mapping[str, str]) -> list[NodeSpec]:
    """The nodes the environment asks for; empty for the single node of the classic profile."""
    count = requested_nodes(env)
    if count == 1:
        return []
    return plan(count, _positive_int(env, ZONES_VARIABLE, None))


# --- the layout and power states, as the state directory keeps them ----------------------------------


def layout_file(ctx: Context) -> Path:
    return ctx.state / "nodes.json"


def save_layout(ctx: Context, nodes: list[NodeSpec]) -> None:
    path = layout_file(ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(n) for n in nodes], indent=2) + "\n")


def parse_layout(text: str) -> list[NodeSpec]:
    try:
        return [NodeSpec(**entry) for entry in json.loads(text)]
    except (ValueError, TypeError) as e:
        raise ClusterError(f"the node layout file is unreadable ({e}); run `down` and `up` again") from None


def load_layout(ctx: Context) -> list[NodeSpec]:
    """The running cluster's nodes; empty when it has the single classic node (or none)."""
    try:
        return parse_layout(layout_file(ctx).read_text())
    except FileNotFoundError:
        return []


def find_node(nodes: list[NodeSpec], name: str) -> NodeSpec:
    for n in nodes:
        if name in (n.name, str(n.index)):
            return n
    if not nodes:
        raise ClusterError(
            f"node {name!r}: this cluster has one node; power verbs need {NODES_VARIABLE} >= 2"
        )
    names = ", ".join(n.name for n in nodes)
    raise ClusterError(f"node {name!r} is not in this cluster (nodes: {names})")


def node_state_dir(ctx: Context, node: NodeSpec) -> Path:
    return ctx.state / "nodes" / node.name


def power_state(ctx: Context, node: NodeSpec) -> PowerState:
    try:
        return PowerState((node_state_dir(ctx, node) / "power").read_text().strip())
    except (OSError, ValueError):
        return PowerState.RUNNING


def set_power_state(ctx: Context, node: NodeSpec, state: PowerState) -> None:
    path = node_state_dir(ctx, node) / "power"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(state.value + "\n")


# What a verb may do from each state (a verb not listed for a state is refused, naming both).
TRANSITIONS: dict[str, dict[PowerState, PowerState]] = {
    "poweroff": {PowerState.RUNNING: PowerState.POWERED_OFF, PowerState.PARTITIONED: PowerState.POWERED_OFF},
    "poweron": {PowerState.POWERED_OFF: PowerState.RUNNING},
    "partition": {PowerState.RUNNING: PowerState.PARTITIONED},
    "heal": {PowerState.PARTITIONED: PowerState.RUNNING},
}


def next_state(verb: str, node: str, current: PowerState) -> PowerState:
    allowed = TRANSITIONS[verb]
    if current not in allowed:
        can = ", ".join(s.value for s in allowed)
        raise ClusterError(
            f"{verb} {node}: the node is {current.value}; {verb} applies to a node that is {can}"
        )
    return allowed[current]


def runtime_addresses(ctx: Context) -> list[str]:
    """The containerd socket of every node that is not powered off (an image is imported into each): the
    single node's, or each running node's of many."""
    nodes = load_layout(ctx)
    if not nodes:
        return [containerd_address(ctx)]
    return [
        containerd_address(ctx, n.name) for n in nodes if power_state(ctx, n) is not PowerState.POWERED_OFF
    ]
