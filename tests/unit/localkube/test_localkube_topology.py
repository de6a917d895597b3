"""The multi-node layout (PGOP_FULL_NODES): names, zones, addresses and pod slices; the variables'
errors; the power verbs' transitions; the layout file."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from localkube import topology
from localkube.common import ClusterError, Context, containerd_address
from localkube.nodes import parse_micro_time
from localkube.topology import PowerState


def test_one_node_is_the_classic_profile_and_is_the_default() -> None:
    assert topology.requested_nodes({}) == 1
    assert topology.requested_layout({}) == []
    assert topology.requested_layout({"PGOP_FULL_NODES": "1"}) == []


def test_three_nodes_get_their_own_name_zone_address_and_pod_slice() -> None:
    nodes = topology.requested_layout({"PGOP_FULL_NODES": "3"})
    assert [n.name for n in nodes] == ["localkube-node-1", "localkube-node-2", "localkube-node-3"]
    assert [n.zone for n in nodes] == ["zone-a", "zone-b", "zone-c"]
    assert [n.ip for n in nodes] == ["10.245.0.11", "10.245.0.12", "10.245.0.13"]
    assert [n.pod_cidr for n in nodes] == ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"]
    assert [n.host_veth for n in nodes] == ["lkn1", "lkn2", "lkn3"]
    assert nodes[0].pod_gateway == "10.244.1.1"
    assert nodes[1].labels == {"topology.kubernetes.io/zone": "zone-b"}


def test_slices_are_disjoint_inside_the_cluster_range_and_miss_the_hosts_address() -> None:
    nodes = topology.plan(topology.MAX_NODES)
    cluster = ipaddress.ip_network(topology.CLUSTER_POD_CIDR)
    slices = [ipaddress.ip_network(n.pod_cidr) for n in nodes]
    assert all(s.subnet_of(cluster) for s in slices)  # type: ignore[arg-type]
    assert len({s for s in slices}) == len(slices)
    assert not any(ipaddress.ip_address(topology.HOST_POD_FACING_IP) in s for s in slices)
    assert all(ipaddress.ip_address(n.ip) in topology.NODE_NETWORK for n in nodes)
    assert topology.HOST_NODE_IP not in {n.ip for n in nodes}


def test_zones_spread_nodes_round_robin() -> None:
    nodes = topology.requested_layout({"PGOP_FULL_NODES": "5", "PGOP_FULL_ZONES": "2"})
    assert [n.zone for n in nodes] == ["zone-a", "zone-b", "zone-a", "zone-b", "zone-a"]


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"PGOP_FULL_NODES": "three"}, "PGOP_FULL_NODES='three'"),
        ({"PGOP_FULL_NODES": "0"}, "PGOP_FULL_NODES=0"),
        ({"PGOP_FULL_NODES": "10"}, "PGOP_FULL_NODES=10"),
        ({"PGOP_FULL_NODES": "-2"}, "PGOP_FULL_NODES='-2'"),
        ({"PGOP_FULL_NODES": "3", "PGOP_FULL_ZONES": "4"}, "PGOP_FULL_ZONES=4"),
        ({"PGOP_FULL_NODES": "3", "PGOP_FULL_ZONES": "0"}, "PGOP_FULL_ZONES=0"),
    ],
)
def test_bad_values_are_refused_naming_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ClusterError, match=names):
        topology.requested_layout(env)


def test_power_verbs_move_only_between_the_states_they_apply_to() -> None:
    assert topology.next_state("poweroff", "n", PowerState.RUNNING) is PowerState.POWERED_OFF
    assert topology.next_state("poweroff", "n", PowerState.PARTITIONED) is PowerState.POWERED_OFF
    assert topology.next_state("poweron", "n", PowerState.POWERED_OFF) is PowerState.RUNNING
    assert topology.next_state("partition", "n", PowerState.RUNNING) is PowerState.PARTITIONED
    assert topology.next_state("heal", "n", PowerState.PARTITIONED) is PowerState.RUNNING
    with pytest.raises(ClusterError, match="poweron n: the node is running"):
        topology.next_state("poweron", "n", PowerState.RUNNING)
    with pytest.raises(ClusterError, match="partition n: the node is powered-off"):
        topology.next_state("partition", "n", PowerState.POWERED_OFF)
    with pytest.raises(ClusterError, match="heal n: the node is powered-off"):
        topology.next_state("heal", "n", PowerState.POWERED_OFF)


def test_the_layout_and_power_states_round_trip_through_the_state_directory(tmp_path: Path) -> None:
    ctx = Context(state=tmp_path, cache=tmp_path / "cache")
    assert topology.load_layout(ctx) == []
    assert topology.runtime_addresses(ctx) == [containerd_address(ctx)]
    nodes = topology.plan(3)
    topology.save_layout(ctx, nodes)
    assert topology.load_layout(ctx) == nodes
    assert topology.power_state(ctx, nodes[0]) is PowerState.RUNNING
    topology.set_power_state(ctx, nodes[2], PowerState.POWERED_OFF)
    assert topology.power_state(ctx, nodes[2]) is PowerState.POWERED_OFF
    # Images go to every node that is not powered off, each through its own containerd.
    assert topology.runtime_addresses(ctx) == [containerd_address(ctx, n.name) for n in nodes[:2]]
    assert len(set(topology.runtime_addresses(ctx))) == 2


def test_an_unreadable_layout_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="run `down` and `up` again"):
        topology.parse_layout("{not json")


def test_nodes_are_found_by_name_or_number_and_unknown_ones_are_named() -> None:
    nodes = topology.plan(3)
    assert topology.find_node(nodes, "2") is nodes[1]
    assert topology.find_node(nodes, "localkube-node-3") is nodes[2]
    with pytest.raises(ClusterError, match="node 'x' is not in this cluster"):
        topology.find_node(nodes, "x")
    with pytest.raises(ClusterError, match="PGOP_FULL_NODES >= 2"):
        topology.find_node([], "localkube-node-1")


def test_a_lease_renewal_time_is_read_to_the_microsecond() -> None:
    assert parse_micro_time("2026-12-05T11:21:09.250000Z") == pytest.approx(1796469669.25)
    assert parse_micro_time("") == 0.0
    assert parse_micro_time("2026-12-05T11:21:09Z") == 0.0  # not a MicroTime: taken as no renewal
