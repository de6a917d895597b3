"""The full profile with three real nodes (PGOP_FULL_NODES=3): zones and hostnames per node, pod and
Service networking and DNS across nodes, node-local volumes, and the node verbs — a powered-off node's
every process and container is gone and its pods unreachable, and it comes back Ready; a partitioned node
is cut off while its processes live on, and heals. (That a lost node goes `Unknown` after the node-monitor
grace period is shown by test_node_loss.py, whose NodeLost waits for it.) Runs on the multi-node
sub-tier's cluster (tests/e2e/nodes/conftest.py)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from localkube import nodenet, nodes, topology
from localkube.images.containerd import ensure_images
from localkube.teardown import leftovers

from harness.local_cluster import ClusterManager, Kube
from harness.paths import LOCALKUBE

BASE_IMAGE = "localkube.local/base:bookworm"
GREETER = (
    "import os, socketserver\n"
    "class H(socketserver.StreamRequestHandler):\n"
    "    def handle(self):\n"
    "        self.wfile.write(('hello from ' + os.environ['HOSTNAME'] + '\\n').encode())\n"
    "socketserver.TCPServer.allow_reuse_address = True\n"
    "socketserver.TCPServer(('0.0.0.0', 8080), H).serve_forever()\n"
)
# Run in a client pod: argv[1:] are host:port targets; prints one line per target, the greeting or ERR.
PROBE = (
    "import socket, sys\n"
    "for t in sys.argv[1:]:\n"
    "    h, p = t.rsplit(':', 1)\n"
    "    try:\n"
    "        with socket.create_connection((h, int(p)), timeout=3) as s:\n"
    "            print(s.makefile().readline().strip() or 'EMPTY')\n"
    "    except OSError as e:\n"
    "        print('ERR', type(e).__name__)\n"
)
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# What the node lifecycle controller allows before it marks a silent node NotReady (node-monitor grace
# period, 50 s by default), plus the time to notice.
NOT_READY_WITHIN = 120


@pytest.fixture(scope="module")
def layout(nodes_kube: Kube) -> list[topology.NodeSpec]:
    found = topology.load_layout(nodes_kube.ctx)
    assert len(found) >= 3, f"the running full profile has {len(found)} nodes in its layout"
    return found


@pytest.fixture(scope="module")
def ns(nodes_kube: Kube, layout: list[topology.NodeSpec]) -> Iterator[str]:
    ensure_images(nodes_kube.ctx, [BASE_IMAGE])  # into every node's containerd
    name = f"nodes-e2e-{uuid.uuid4().hex[:6]}"
    nodes_kube.kubectl("create", "namespace", name)
    pods = [pod(f"greeter-{n.index}", name, n, ["python3", "-c", GREETER], app="greeter") for n in layout]
    pods += [pod(f"client-{n.index}", name, n, ["sleep", "3600"], app="client") for n in layout]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "greeter", "namespace": name},
        "spec": {"selector": {"app": "greeter"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    apply(nodes_kube, *pods, service)
    for p in pods:
        wait_ready(nodes_kube, p["metadata"]["name"], name)
    yield name
    nodes_kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, ns: str, node: topology.NodeSpec, command: list[str], app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 999, "runAsGroup": 999, "fsGroup": 999},
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {topology.HOSTNAME_LABEL: node.name},
            "containers": [
                {
                    "name": "main",
                    "image": BASE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": RESTRICTED,
                }
            ],
        },
    }


def apply(kube: Kube, *objs: dict[str, Any]) -> None:
    kube.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    )


def get(kube: Kube, kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
    scope = ["-n", ns] if ns else []
    return dict(json.loads(kube.kubectl(*scope, "get", kind, name, "-o", "json").stdout))


def wait_ready(kube: Kube, name: str, ns: str, timeout: int = 180) -> None:
    res = kube.kubectl("-n", ns, "wait", "--for=condition=Ready", f"pod/{name}", f"--timeout={timeout}s",
                       check=False, timeout=timeout + 10)  # fmt: skip
    if res.returncode != 0:
        describe = kube.kubectl("-n", ns, "describe", "pod", name, check=False).stdout
        raise AssertionError(f"pod {ns}/{name} not Ready: {res.stderr}\n{describe[-3000:]}")


def probe(kube: Kube, ns: str, client: str, *targets: str) -> list[str]:
    res = kube.kubectl("-n", ns, "exec", client, "--", "python3", "-c", PROBE, *targets, timeout=90)
    return [str(line) for line in res.stdout.splitlines()]


def probe_until(kube: Kube, ns: str, client: str, target: str, want_ok: bool, timeout: float = 60) -> str:
    """Probe until the answer is a greeting (want_ok) or an error; the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        answer = probe(kube, ns, client, target)[0]
        if answer.startswith("hello") == want_ok or time.monotonic() > deadline:
            return answer
        time.sleep(1)


def pod_ip(kube: Kube, ns: str, name: str) -> str:
    return str(get(kube, "pod", name, ns)["status"]["podIP"])


def node_ready(kube: Kube, name: str) -> str:
    conditions = get(kube, "node", name)["status"]["conditions"]
    return str(next(c["status"] for c in conditions if c["type"] == "Ready"))


def wait_node_ready(kube: Kube, name: str, want: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while (state := node_ready(kube, name)) != want and time.monotonic() < deadline:
        time.sleep(2)
    return state


def localkube(*args: str) -> str:
    res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, f"localkube {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def test_every_node_is_ready_with_its_own_zone_and_hostname(
    nodes_kube: Kube, layout: list[topology.NodeSpec]
) -> None:
    for n in layout:
        obj = get(nodes_kube, "node", n.name)
        labels = obj["metadata"]["labels"]
        assert labels[topology.HOSTNAME_LABEL] == n.name
        assert labels[topology.ZONE_LABEL] == n.zone
        addresses = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
        assert addresses["InternalIP"] == n.ip
        assert node_ready(nodes_kube, n.name) == "True"
    assert len({n.zone for n in layout}) == len(layout), "one zone per node by default"


def test_pods_reach_each_other_and_a_service_across_nodes(
    nodes_kube: Kube, layout: list[topology.NodeSpec], ns: str
) -> None:
    greeters = {n.index: pod_ip(nodes_kube, ns, f"greeter-{n.index}") for n in layout}
    for n in layout:
        assert ipaddress.ip_address(greeters[n.index]) in ipaddress.ip_network(n.pod_cidr)
    targets = [f"{ip}:8080" for ip in greeters.values()]
    for n in layout:
        answers = probe(nodes_kube, ns, f"client-{n.index}", *targets)
        assert answers == [f"hello from greeter-{i}" for i in greeters], f"from {n.name}: {answers}"
    # The Service spreads over the three nodes: from one client, enough connections reach every greeter.
    seen = set(probe(nodes_kube, ns, "client-1", *[f"greeter.{ns}.svc:80"] * 30))
    assert seen == {f"hello from greeter-{i}" for i in greeters}, seen


def test_dns_answers_pods_on_every_node(nodes_kube: Kube, layout: list[topology.NodeSpec], ns: str) -> None:
    script = (
        "import socket\n"
        f"print(socket.gethostbyname('greeter.{ns}.svc.cluster.local'))\n"
        "print(socket.gethostbyname('kubernetes.default.svc'))\n"
    )
    service_ip = get(nodes_kube, "service", "greeter", ns)["spec"]["clusterIP"]
    api_ip = get(nodes_kube, "service", "kubernetes", "default")["spec"]["clusterIP"]
    for n in layout:
        out = nodes_kube.kubectl("-n", ns, "exec", f"client-{n.index}", "--", "python3", "-c", script).stdout
        assert out.split() == [service_ip, api_ip], f"from {n.name}: {out}"


def test_a_volume_is_pinned_to_the_node_its_pod_first_ran_on(
    nodes_kube: Kube, layout: list[topology.NodeSpec], ns: str
) -> None:
    target = layout[1]
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    writer = pod(
        "writer", ns, target, ["sh", "-c", "echo kept > /data/marker && exec sleep 3600"], app="writer"
    )
    writer["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    writer["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    apply(nodes_kube, claim, writer)
    wait_ready(nodes_kube, "writer", ns)
    pv = get(nodes_kube, "pv", get(nodes_kube, "pvc", "data", ns)["spec"]["volumeName"])
    term = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert (term["key"], term["values"]) == (topology.HOSTNAME_LABEL, [target.name])
    path = pv["spec"]["local"]["path"]
    assert path.startswith(str(topology.node_state_dir(nodes_kube.ctx, target) / "volumes") + "/"), path
    # A pod of the claim asked onto another node cannot start: the volume does not follow it.
    nodes_kube.kubectl("-n", ns, "delete", "pod", "writer", "--wait=true", timeout=90)
    elsewhere = pod("reader", ns, layout[2], ["sleep", "3600"], app="reader")
    elsewhere["spec"]["volumes"] = writer["spec"]["volumes"]
    apply(nodes_kube, elsewhere)
    deadline = time.monotonic() + 30
    reason = ""
    while time.monotonic() < deadline and "node affinity" not in reason:
        conds = get(nodes_kube, "pod", "reader", ns).get("status", {}).get("conditions", [])
        reason = " ".join(c.get("message", "") for c in conds if c["type"] == "PodScheduled")
        time.sleep(1)
    assert "node affinity" in reason, reason
    assert get(nodes_kube, "pod", "reader", ns)["status"]["phase"] == "Pending"
    nodes_kube.kubectl("-n", ns, "delete", "pod", "reader", "--wait=false")


def test_poweroff_makes_the_node_not_ready_and_its_pods_unreachable_and_poweron_brings_it_back(
    nodes_kube: Kube, layout: list[topology.NodeSpec], ns: str
) -> None:
    victim = layout[2]
    ctx = nodes_kube.ctx
    target = f"{pod_ip(nodes_kube, ns, f'greeter-{victim.index}')}:8080"
    assert probe(nodes_kube, ns, "client-1", target) == [f"hello from greeter-{victim.index}"]
    localkube("poweroff", victim.name)
    assert topology.power_state(ctx, victim) is topology.PowerState.POWERED_OFF
    assert [c for c in nodes.components([victim]) if ctx.pid_of(c) is not None] == []
    assert nodes.node_processes(ctx, victim) == [], "a shim or daemon of the node survived"
    assert nodes.container_pids(ctx, victim) == set(), "a container of the node survived"
    assert not nodenet.node_netns_exists(victim)
    assert probe(nodes_kube, ns, "client-1", target)[0].startswith("ERR")
    # The node going Unknown after the node-monitor grace period (50 s) is test_node_loss.py's: the
    # operator's NodeLost waits for it there.
    # The pod is still bound to the node: the API server only knows the node stopped reporting.
    assert get(nodes_kube, "pod", f"greeter-{victim.index}", ns)["spec"]["nodeName"] == victim.name

    localkube("poweron", victim.name)
    assert node_ready(nodes_kube, victim.name) == "True"

    # The node was off for less than the grace period, so the API server may still show its pods Ready
    # (and for a moment without an address while their sandboxes are made again): what says they run
    # again is their answers, once the kubelet has started their containers anew.
    def greeter_answers() -> str:
        ip = get(nodes_kube, "pod", f"greeter-{victim.index}", ns)["status"].get("podIP")
        return probe(nodes_kube, ns, "client-1", f"{ip}:8080")[0] if ip else "no address yet"

    deadline = time.monotonic() + 180
    while (
        answer := greeter_answers()
    ) != f"hello from greeter-{victim.index}" and time.monotonic() < deadline:
        time.sleep(2)
    assert answer == f"hello from greeter-{victim.index}", answer

    def back() -> list[str]:
        try:
            answer = probe(nodes_kube, ns, f"client-{victim.index}", f"greeter.{ns}.svc:80")
        except AssertionError:  # the client's container not started again yet: exec refused
            return []
        return answer if answer and answer[0].startswith("hello from greeter-") else []

    deadline = time.monotonic() + 120
    while not (reached := back()) and time.monotonic() < deadline:
        time.sleep(2)
    assert reached, "the client on the powered-on node never reached the greeter Service"


def test_partition_cuts_the_node_off_while_its_processes_live_and_heal_restores_it(
    nodes_kube: Kube, layout: list[topology.NodeSpec], ns: str
) -> None:
    victim = layout[1]
    ctx = nodes_kube.ctx
    target = f"{pod_ip(nodes_kube, ns, f'greeter-{victim.index}')}:8080"
    assert probe(nodes_kube, ns, "client-1", target) == [f"hello from greeter-{victim.index}"]
    pids = {c: ctx.pid_of(c) for c in nodes.components([victim])}
    localkube("partition", victim.name)
    assert topology.power_state(ctx, victim) is topology.PowerState.PARTITIONED
    assert probe(nodes_kube, ns, "client-1", target)[0].startswith("ERR")
    assert {c: ctx.pid_of(c) for c in nodes.components([victim])} == pids, "a daemon of the node died"
    # Its greeter still runs and answers inside the node: only the link is gone.
    inside = nodenet.in_node(victim, "python3", "-c", PROBE, target)
    assert inside.stdout.strip() == f"hello from greeter-{victim.index}", inside.stdout + inside.stderr

    localkube("heal", victim.name)
    assert wait_node_ready(nodes_kube, victim.name, "True", NOT_READY_WITHIN) == "True"
    assert (
        probe_until(nodes_kube, ns, "client-1", target, want_ok=True) == f"hello from greeter-{victim.index}"
    )
    assert {c: ctx.pid_of(c) for c in nodes.components([victim])} == pids


def test_status_lists_every_node(nodes_kube: Kube, layout: list[topology.NodeSpec]) -> None:
    out = localkube("status")
    for n in layout:
        assert f"node {n.name}: running, zone {n.zone}, ip {n.ip}" in out, out


@pytest.mark.cluster_lifecycle
def test_down_leaves_nothing_behind_even_with_a_node_off_and_one_cut_off(
    nodes_kube: Kube, layout: list[topology.NodeSpec], cluster_manager: ClusterManager
) -> None:
    ctx = nodes_kube.ctx
    localkube("poweroff", layout[2].name)
    localkube("partition", layout[1].name)
    assert leftovers(ctx), "the cluster should have something running before down"
    res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), "down"],
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    cluster_manager.forget()
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(ctx) == []
    assert nodenet.our_node_netns() == [] and nodenet.our_links() == []
    assert not ctx.state.exists(), f"{ctx.state} was not removed"
