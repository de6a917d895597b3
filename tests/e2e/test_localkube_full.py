"""The full profile's node is a real one: real kubelet, containers from locally built images, pod and
Service networking, DNS, persistent volumes that keep data for a non-root pod, restarts, logs, exec,
and a `cluster-down` that leaves nothing behind (last: it stops the cluster the tier used)."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from localkube import node
from localkube.common import NODE_NAME, POD_CIDR, RUN_DIR
from localkube.images.containerd import ensure_images
from localkube.teardown import leftovers

from harness.local_cluster import ClusterManager, Kube
from harness.paths import LOCALKUBE

BASE_IMAGE = "localkube.local/base:bookworm"
# A TCP greeter on port 8080 that says which pod answered: python3 of the base image, stdlib only.
GREETER = (
    "import os, socketserver\n"
    "class H(socketserver.StreamRequestHandler):\n"
    "    def handle(self):\n"
    "        self.wfile.write(('hello from ' + os.environ['HOSTNAME'] + '\\n').encode())\n"
    "socketserver.TCPServer.allow_reuse_address = True\n"
    "print('listening on 8080', flush=True)\n"
    "socketserver.TCPServer(('0.0.0.0', 8080), H).serve_forever()\n"
)
RESTRICTED = {  # what the operator's pods use (docs/architecture.md)
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod(name: str, ns: str, command: list[str], **extra: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": BASE_IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "securityContext": RESTRICTED,
        **extra.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {
            # OnRootMismatch as the operator's StatefulSet has it: with the default (Always) the kubelet
            # re-chmods PGDATA to 2770 on every mount, and PostgreSQL refuses a group-writable PGDATA.
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 999,
                "runAsGroup": 999,
                "fsGroup": 999,
                "fsGroupChangePolicy": "OnRootMismatch",
            },
            "terminationGracePeriodSeconds": 2,
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "containers": [container],
            **extra,
        },
    }


def apply(kube: Kube, *objs: dict[str, Any]) -> None:
    doc = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
    kube.kubectl("apply", "-f", "-", input=json.dumps(doc))


def get(kube: Kube, kind: str, name: str, ns: str) -> dict[str, Any]:
    return dict(json.loads(kube.kubectl("-n", ns, "get", kind, name, "-o", "json").stdout))


def wait_ready(kube: Kube, name: str, ns: str, timeout: int = 90) -> dict[str, Any]:
    res = kube.kubectl(
        "-n",
        ns,
        "wait",
        "--for=condition=Ready",
        f"pod/{name}",
        f"--timeout={timeout}s",
        check=False,
        timeout=timeout + 10,
    )
    if res.returncode != 0:
        describe = kube.kubectl("-n", ns, "describe", "pod", name, check=False).stdout
        raise AssertionError(f"pod {ns}/{name} not Ready: {res.stderr}\n{describe[-3000:]}")
    return get(kube, "pod", name, ns)


def read_greeting(host: str, port: int, timeout: float = 30) -> str:
    """Connect from the host and read one line; retried while kube-proxy's rules converge."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=3) as s:
                return s.makefile().readline().strip()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def ns(full_kube: Kube) -> Iterator[str]:
    ensure_images(full_kube.ctx, [BASE_IMAGE])
    name = f"node-e2e-{uuid.uuid4().hex[:6]}"
    full_kube.kubectl("create", "namespace", name)
    yield name
    full_kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_node_is_ready_with_the_real_kubelet(full_kube: Kube) -> None:
    n = json.loads(full_kube.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    ready = {c["type"]: c["status"] for c in n["status"]["conditions"]}["Ready"]
    info = n["status"]["nodeInfo"]
    assert ready == "True"
    assert info["kubeletVersion"].startswith("v1.")
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert "kwok" not in info["kubeletVersion"]


def test_pod_serves_tcp_on_its_ip_and_through_a_cluster_ip_service(full_kube: Kube, ns: str) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "greeter", "namespace": ns},
        "spec": {"selector": {"app": "greeter"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    apply(full_kube, pod("greeter", ns, ["python3", "-c", GREETER]), service)
    p = wait_ready(full_kube, "greeter", ns)
    pod_ip = p["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_CIDR)
    assert read_greeting(pod_ip, 8080) == "hello from greeter"
    cluster_ip = get(full_kube, "service", "greeter", ns)["spec"]["clusterIP"]
    assert read_greeting(cluster_ip, 80) == "hello from greeter"


def test_pods_resolve_services_by_name_and_reach_the_api_server(full_kube: Kube, ns: str) -> None:
    apply(full_kube, pod("client", ns, ["sleep", "600"]))
    wait_ready(full_kube, "client", ns)
    script = (
        "import socket, ssl, urllib.request\n"
        f"s = socket.create_connection(('greeter.{ns}.svc', 80), timeout=5)\n"
        "print(s.makefile().readline().strip())\n"
        "ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
        "url = 'https://kubernetes.default.svc/livez'\n"
        "print(urllib.request.urlopen(url, context=ctx, timeout=5).status)\n"
    )
    # The greeter comes from the previous test; start it if this one runs alone.
    if full_kube.kubectl("-n", ns, "get", "service", "greeter", check=False).returncode != 0:
        test_pod_serves_tcp_on_its_ip_and_through_a_cluster_ip_service(full_kube, ns)
    out = full_kube.kubectl("-n", ns, "exec", "client", "--", "python3", "-c", script).stdout.split()
    assert out == ["hello", "from", "greeter", "200"]


def test_logs_and_exec(full_kube: Kube, ns: str) -> None:
    apply(full_kube, pod("talker", ns, ["sh", "-c", "echo first line; echo second line; exec sleep 600"]))
    wait_ready(full_kube, "talker", ns)
    logs = ""
    for _ in range(20):
        logs = full_kube.kubectl("-n", ns, "logs", "talker").stdout
        if "second line" in logs:
            break
        time.sleep(0.5)
    assert logs.splitlines()[:2] == ["first line", "second line"]
    ids = full_kube.kubectl("-n", ns, "exec", "talker", "--", "id", "-u").stdout.strip()
    assert ids == "999"
    echoed = full_kube.kubectl("-n", ns, "exec", "-i", "talker", "--", "cat", input="through stdin\n").stdout
    assert echoed == "through stdin\n"


def test_exited_container_is_restarted_by_the_kubelet(full_kube: Kube, ns: str) -> None:
    apply(full_kube, pod("crasher", ns, ["sh", "-c", "echo run; sleep 1; exit 3"]))
    deadline = time.monotonic() + 60
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        statuses = get(full_kube, "pod", "crasher", ns).get("status", {}).get("containerStatuses", [])
        status = statuses[0] if statuses else {}
        if status.get("restartCount", 0) >= 1:
            break
        time.sleep(1)
    assert status.get("restartCount", 0) >= 1, status
    assert status["lastState"]["terminated"]["exitCode"] == 3


def test_volume_keeps_data_of_a_non_root_pod_across_pod_recreation(full_kube: Kube, ns: str) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    mounts = {"volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}]}
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    # What PostgreSQL does with its PGDATA: a 0700 subdirectory owned by the (non-root) server user.
    write = (
        "mkdir -m 0700 /var/lib/postgresql/data/pgdata && "
        "echo written-by-$(id -u) > /var/lib/postgresql/data/pgdata/marker && exec sleep 600"
    )
    apply(full_kube, claim, pod("writer", ns, ["sh", "-c", write], container=mounts, volumes=volumes))
    wait_ready(full_kube, "writer", ns)
    assert get(full_kube, "pvc", "data", ns)["status"]["phase"] == "Bound"
    pv_name = get(full_kube, "pvc", "data", ns)["spec"]["volumeName"]
    full_kube.kubectl("-n", ns, "delete", "pod", "writer", "--wait=true", timeout=90)

    read = "stat -c '%u:%g %a' /var/lib/postgresql/data/pgdata && cat /var/lib/postgresql/data/pgdata/marker"
    apply(
        full_kube,
        pod("reader", ns, ["sh", "-c", read + " && exec sleep 600"], container=mounts, volumes=volumes),
    )
    wait_ready(full_kube, "reader", ns)
    assert get(full_kube, "pvc", "data", ns)["spec"]["volumeName"] == pv_name
    logs = full_kube.kubectl("-n", ns, "logs", "reader").stdout.splitlines()
    owner, mode = logs[0].split()
    # 2700 is fine: the setgid bit comes from the fsGroup-owned volume root; PostgreSQL only refuses
    # group-write or any access for others.
    assert (owner, int(mode, 8) & 0o777) == ("999:999", 0o700), logs
    assert logs[1] == "written-by-999"


@pytest.mark.cluster_lifecycle
def test_full_down_leaves_nothing_behind(full_kube: Kube, cluster_manager: ClusterManager) -> None:
    ctx = full_kube.ctx
    assert leftovers(ctx), "the full profile should have a node running before down"
    res = subprocess.run(
        [sys.executable, str(LOCALKUBE / "cluster.py"), "down"], capture_output=True, text=True, timeout=240
    )
    cluster_manager.forget()
    assert res.returncode == 0, res.stdout + res.stderr
    assert leftovers(ctx) == []
    for name in node.COMPONENTS:
        assert ctx.pid_of(name) is None, f"{name} still runs"
    assert not RUN_DIR.exists() or not any(RUN_DIR.iterdir()), "the run directory is not empty"
    assert not ctx.state.exists(), f"{ctx.state} was not removed"
