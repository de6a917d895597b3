"""Leader election between two operator processes on the real API server: one acts, the other waits;
killing the leader hands over; a process that loses its Lease exits non-zero; a leader rides out an API
outage shorter than its lease."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from harness.kube import apply, get_json, make_namespace
from harness.objects import cluster
from harness.operator_process import OPERATOR_NS, SESSION, OperatorEnv, OperatorProcess, start_operator
from harness.waiting import wait_until

LEASE = "pg-operator-leader"
DURATION = 15


@pytest.fixture
def pair(operator_env: OperatorEnv) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    a = start_operator(operator_env, "leader-a")
    a.wait_leader()
    b = start_operator(operator_env, "leader-b")
    yield a, b
    for proc in (a, b):
        proc.stop()


def applies(op: OperatorProcess) -> float:
    return op.metric('pg_operator_api_requests_total{verb="apply"}')


def test_only_the_leader_acts_and_killing_it_hands_over(
    operator_env: OperatorEnv, pair: tuple[OperatorProcess, OperatorProcess]
) -> None:
    kube = operator_env.kube
    a, b = pair
    wait_until("the standby to be ready as a candidate", lambda: b.readyz() == 200, timeout=30)
    assert not b.is_leader()
    ns = make_namespace(kube, "leader")
    apply(kube, cluster("ha-db", ns, replicas=2))
    wait_until(
        "the leader to create the StatefulSet",
        lambda: kube.kubectl("get", "statefulset", "ha-db", "-n", ns, check=False).returncode == 0,
    )
    time.sleep(3)
    assert applies(a) > 0
    standby = b.metrics()
    assert standby["pg_operator_leader"] == 0
    assert applies(b) == 0, "the standby applied something"
    assert not any(k.startswith("pg_operator_reconcile_total{") and v for k, v in standby.items()), (
        "it reconciled"
    )
    holder = get_json(kube, "lease", LEASE, "-n", OPERATOR_NS)["spec"]["holderIdentity"]
    assert holder == a.identity

    a.kill9()
    killed = time.monotonic()
    wait_until("the standby to take over", b.is_leader, timeout=2 * DURATION, interval=0.1)
    handover = time.monotonic() - killed
    print(f"\nleader hand-over after kill -9: {handover:.1f} s (lease duration {DURATION} s)")
    assert get_json(kube, "lease", LEASE, "-n", OPERATOR_NS)["spec"]["holderIdentity"] == b.identity

    # the new leader reconciles: a scale-up is carried out by it
    kube.kubectl(
        "patch", "pgc", "ha-db", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"replicas": 3}})
    )
    wait_until(
        "the new leader to scale the StatefulSet",
        lambda: get_json(kube, "statefulset", "ha-db", "-n", ns)["spec"]["replicas"] == 3,
    )
    assert applies(b) > 0
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_losing_the_lease_makes_the_process_exit_non_zero(
    operator_env: OperatorEnv, pair: tuple[OperatorProcess, OperatorProcess]
) -> None:
    kube = operator_env.kube
    a, b = pair
    b.stop()
    # Someone else takes the Lease (as an expired lease would be taken): the holder must stop acting.
    kube.kubectl(
        "patch",
        "lease",
        LEASE,
        "-n",
        OPERATOR_NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"holderIdentity": "somebody-else"}}),
    )
    assert a.proc is not None
    code = a.proc.wait(timeout=DURATION)
    assert code == 1, f"exit code {code}"
    assert "lost leadership" in a.log_text()
    kube.kubectl(
        "patch",
        "lease",
        LEASE,
        "-n",
        OPERATOR_NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"holderIdentity": ""}}),
    )


class ApiRelay:
    """A loopback TCP relay in front of the API server (bytes only; TLS stays end to end). During an
    outage every open connection is reset and new ones are refused, so each request fails at once: what
    the operator saw of the starved API server in the 1000-cluster bench (ConnectTimeout for ~10 s)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.refusing = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing.is_set():
                self._reset(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with self._lock:
                self._open.discard(sock)
            self._reset(sock)

    def outage(self, seconds: float) -> None:
        self.refusing.set()
        with self._lock:
            live = list(self._open)
            self._open.clear()
        for sock in live:
            self._reset(sock)
        time.sleep(seconds)
        self.refusing.clear()

    def close(self) -> None:
        self.refusing.set()
        self.listener.close()
        with self._lock:
            live = list(self._open)
        for sock in live:
            self._reset(sock)


OUTAGE_LEASE = LEASE  # the operator's RBAC allows this Lease only; the other tests' operators are stopped


def renew_time(kube: object) -> str:
    return str(get_json(kube, "lease", OUTAGE_LEASE, "-n", OPERATOR_NS)["spec"].get("renewTime"))


def test_the_leader_rides_out_an_api_outage_shorter_than_its_lease(
    operator_env: OperatorEnv, tmp_path: Path
) -> None:
    kube = operator_env.kube
    config = yaml.safe_load(operator_env.kubeconfig.read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    assert server.hostname and server.port
    relay = ApiRelay(server.hostname, server.port)
    # Same address family and host as the certificate names (127.0.0.1), another port: TLS still verifies.
    config["clusters"][0]["cluster"]["server"] = f"https://{server.hostname}:{relay.port}"
    relayed = tmp_path / "relayed.kubeconfig"
    relayed.write_text(yaml.safe_dump(config))
    relayed.chmod(0o600)
    ns = make_namespace(kube, "outage")
    op = OperatorProcess(relayed, operator_env.log_dir, f"outage-{SESSION}", "--namespace", ns).start()
    try:
        op.wait_leader()
        # Start the outage right after a renewal: 10.8 s from it is past the old rule's give-up point (no
        # successful renewal for 10 s) and short of the lease itself (15 s, less the 2 s margin).
        before = renew_time(kube)
        wait_until("a renewal", lambda: renew_time(kube) != before, timeout=10, interval=0.05)
        renewed = renew_time(kube)
        relay.outage(10.8)
        wait_until("a renewal after the outage", lambda: renew_time(kube) != renewed, timeout=5, interval=0.2)
        assert op.alive(), f"the leader exited during the outage:\n{op.log_text()[-2000:]}"
        assert op.is_leader()
        lease = get_json(kube, "lease", OUTAGE_LEASE, "-n", OPERATOR_NS)["spec"]
        assert lease["holderIdentity"] == op.identity
        assert "lease renewal failed" in op.log_text(), "the outage did not reach the operator"
    finally:
        op.stop()
        relay.close()
        kube.kubectl("delete", "namespace", ns, "--wait=false")
