"""What each node of many is configured with: its own runtime socket and directories, cgroup root,
identity, address and pod slice; the single node's configuration is what it always was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localkube import netpol, network, topology
from localkube.common import NODE_NAME, POD_CIDR, RUN_DIR, Context
from localkube.host import cgroup_parent
from localkube.hostpath.provisioner import Provisioner
from localkube.node import _containerd_config, _kube_proxy_config, _kubelet_config
from localkube.pki import Pki


@pytest.fixture
def ctx(tmp_path: Path) -> Context:
    (tmp_path / "cache" / "current").mkdir(parents=True)
    (tmp_path / "cache" / "current" / "kube-router").touch()
    return Context(state=tmp_path / "state", cache=tmp_path / "cache")


def test_each_node_has_its_own_runtime(ctx: Context) -> None:
    node = topology.plan(3)[1]
    conf = _containerd_config(ctx, node.name)
    assert f'root = "{ctx.state}/nodes/{node.name}/containerd"' in conf
    assert f'address = "{RUN_DIR}/nodes/{node.name}/containerd/containerd.sock"' in conf
    assert f'conf_dir = "{ctx.state}/nodes/{node.name}/cni/net.d"' in conf
    single = _containerd_config(ctx)
    assert f'address = "{RUN_DIR}/containerd/containerd.sock"' in single
    assert f'root = "{ctx.state}/containerd"' in single


def test_each_kubelet_has_its_address_cgroup_root_socket_and_serving_certificate(ctx: Context) -> None:
    node = topology.plan(3)[2]
    pki = Pki(ctx.pki)
    conf = _kubelet_config(ctx, pki, node.ip, node)
    assert conf["address"] == node.ip
    assert conf["cgroupRoot"] == f"/{cgroup_parent(ctx)}/{node.name}"
    assert (
        conf["containerRuntimeEndpoint"] == f"unix://{RUN_DIR}/nodes/{node.name}/containerd/containerd.sock"
    )
    assert conf["tlsCertFile"] == str(pki.node_serving(node.name)[0])
    assert conf["podLogsDir"] == str(ctx.state / "nodes" / node.name / "pod-logs")
    single = _kubelet_config(ctx, pki, "192.0.2.9")
    assert single["cgroupRoot"] == f"/{cgroup_parent(ctx)}"
    assert single["tlsCertFile"] == str(pki.kubelet_serving[0])


def test_kube_proxy_of_a_node_names_it_and_knows_the_whole_pod_range(ctx: Context) -> None:
    node = topology.plan(2)[0]
    conf = _kube_proxy_config(ctx, "nftables", node)
    assert conf["hostnameOverride"] == node.name
    assert conf["clusterCIDR"] == topology.CLUSTER_POD_CIDR
    assert conf["clientConnection"]["kubeconfig"].endswith("nodes-kube-proxy.kubeconfig")
    single = _kube_proxy_config(ctx, "nftables")
    assert (single["hostnameOverride"], single["clusterCIDR"]) == (NODE_NAME, POD_CIDR)


def test_kube_router_of_a_node_names_it_and_reaches_the_api_by_the_hosts_address(ctx: Context) -> None:
    node = topology.plan(2)[1]
    flags = set(netpol.argv(ctx, node)[1:])
    assert f"--hostname-override={node.name}" in flags
    assert f"--kubeconfig={ctx.kubeconfig('nodes-admin')}" in flags
    assert netpol.component(node) == f"{node.name}/kube-router"


def test_a_nodes_pods_get_its_slice_and_are_not_masqueraded_by_the_bridge(ctx: Context) -> None:
    node = topology.plan(3)[0]
    network.write_cni_conf(ctx, node.name, subnet=node.pod_cidr, gateway=node.pod_gateway, ip_masq=False)
    path = ctx.state / "nodes" / node.name / "cni" / "net.d" / "10-localkube.conflist"
    bridge = json.loads(path.read_text())["plugins"][0]
    assert bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24", "gateway": "10.244.1.1"}]]
    assert bridge["ipam"]["dataDir"] == str(ctx.state / "nodes" / node.name / "cni" / "ipam")
    network.write_cni_conf(ctx)
    single = json.loads((ctx.state / "cni" / "net.d" / "10-localkube.conflist").read_text())["plugins"][0]
    assert single["ipMasq"] is True
    assert single["ipam"]["ranges"] == [[{"subnet": POD_CIDR, "gateway": network.BRIDGE_IP}]]


def test_volumes_live_on_their_node_and_a_powered_off_node_is_left_alone(tmp_path: Path) -> None:
    prov = Provisioner(api=None, volumes=tmp_path, storage_class="standard", name="p", per_node=True)  # type: ignore[arg-type]
    assert prov.volume_root("localkube-node-2") == tmp_path / "localkube-node-2" / "volumes"
    assert prov.reachable("localkube-node-2")
    (tmp_path / "localkube-node-2").mkdir()
    (tmp_path / "localkube-node-2" / "power").write_text("powered-off\n")
    assert not prov.reachable("localkube-node-2")
    (tmp_path / "localkube-node-2" / "power").write_text("partitioned\n")
    assert prov.reachable("localkube-node-2")  # its disk is there; only its network is cut
    single = Provisioner(api=None, volumes=tmp_path, storage_class="standard", name="p")  # type: ignore[arg-type]
    assert single.volume_root("localkube-node") == tmp_path
