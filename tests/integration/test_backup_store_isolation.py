"""A tenant's object store cannot hold up other tenants or exfiltrate Secrets (issue: tenant isolation),
on the kwok profile with the real operator process:

- a hostile store that sends one byte every few seconds forever holds up only its own cluster (cut off
  at the call deadline, reported as StoreTimeout) while a cluster of another namespace claims its prefix
  in a good store;
- an unlabelled Secret and a plain-HTTP endpoint are refused naming the field, and nothing reaches the
  endpoint;
- a restarted operator trusts the verdicts recorded in status: no ownership request for an unchanged
  spec.backup."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.kube import apply, condition, events, get_or_none, make_namespace
from harness.objects import cluster, s3_credentials_secret
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.s3 import S3Server, s3_server
from harness.waiting import wait_until
from pg_operator.backup.store_ownership import MARKER_NAME

BUCKET = "iso-backups"
# A short call deadline so the hostile store's cut-off shows within the test's waits; plain HTTP is
# allowed by the harness for moto, so the refusal case runs its own operator without it (below).
OPERATOR = OperatorSpec("isolation", ("--store-call-timeout", "5s"),
                        crds=("deploy/crd/backups.yaml", "deploy/crd/scheduledbackups.yaml"),
                        log_must_not_contain=("Traceback",))  # fmt: skip


class SlowDrip:
    """A TCP server that accepts every connection and sends one byte every two seconds, forever."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            while not self._stop.wait(2.0):
                try:
                    conn.sendall(b"H")
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.listener.close()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture
def hostile() -> Iterator[SlowDrip]:
    server = SlowDrip()
    yield server
    server.close()


def backup_spec(endpoint: str, creds: str = "s3-creds") -> dict[str, Any]:
    s3 = {
        "endpointURL": endpoint,
        "bucket": BUCKET,
        "path": "iso",
        "credentials": {"secretName": creds},
    }
    return {"s3": s3, "onDelete": "keep"}


def secret(namespace: str, s3: S3Server, cluster_name: str | None) -> dict[str, Any]:
    body: dict[str, Any] = s3_credentials_secret(
        "s3-creds", namespace, s3.access_key_id, s3.secret_access_key, cluster=cluster_name
    )
    return body


def archiving(kube: Any, ns: str, name: str) -> dict[str, Any]:
    obj = get_or_none(kube, "postgresclusters.db.example.com", name, "-n", ns) or {}
    return dict(condition(obj, "ContinuousArchiving") or {})


def store_requests(s3: S3Server, name: str) -> int:
    """Requests moto logged for one cluster's prefix."""
    listed, named = f"iso%2F{name}%2F".encode(), f"/iso/{name}/".encode()
    with s3.log.open("rb") as f:
        return sum(1 for line in f if b'HTTP/1.1"' in line and (listed in line or named in line))


def test_a_hostile_store_holds_up_only_its_own_namespace(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server, hostile: SlowDrip
) -> None:
    kube = operator_env.kube
    ns_a, ns_b = make_namespace(kube, "drip-a"), make_namespace(kube, "good-b")
    # Several clusters of namespace a on the hostile store, created first: they must not take the shared
    # workers from namespace b.
    for i in range(4):
        apply(
            kube,
            secret(ns_a, s3, None)
            | {
                "metadata": {
                    "name": f"s3-creds-{i}",
                    "namespace": ns_a,
                    "labels": {"db.example.com/cluster": f"a{i}"},
                }
            },
        )
        apply(kube, cluster(f"a{i}", ns_a, replicas=1, backup=backup_spec(hostile.endpoint, f"s3-creds-{i}")))
    wait_until("the hostile store to be called", lambda: hostile.connections > 0, 60)
    apply(kube, secret(ns_b, s3, "b"))
    apply(kube, cluster("b", ns_b, replicas=1, backup=backup_spec(s3.endpoint)))
    marker = f"iso/b/{MARKER_NAME}"
    wait_until("cluster b to claim its prefix", lambda: marker in s3.keys(BUCKET, "iso/b/"), 90)

    def b_reason() -> Any:
        return archiving(kube, ns_b, "b").get("reason")

    wait_until("cluster b's archiving condition", lambda: b_reason() not in (None, "StoreTimeout"), 60)
    # Namespace a: cut off at the deadline and told so.
    wait_until("cluster a0 to report the store timeout",
               lambda: archiving(kube, ns_a, "a0").get("reason") == "StoreTimeout", 90)  # fmt: skip
    cond = archiving(kube, ns_a, "a0")
    assert cond["status"] == "False"
    assert hostile.endpoint in cond["message"]
    reasons = {e["reason"] for e in events(kube, ns_a, "PostgresCluster", "a0")}
    assert "StoreTimeout" in reasons, reasons
    for ns in (ns_a, ns_b):
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_an_unlabelled_secret_and_plain_http_are_refused_and_nothing_is_sent(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server, hostile: SlowDrip
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "exfil")
    # A Secret the tenant did not label for its cluster (say, another team's admin key).
    apply(kube, secret(ns, s3, None) | {"metadata": {"name": "admin-key", "namespace": ns}})
    apply(kube, cluster("thief", ns, replicas=1, backup=backup_spec(hostile.endpoint, "admin-key")))

    def reason() -> Any:
        return archiving(kube, ns, "thief").get("reason")

    wait_until("the refusal in the condition", lambda: reason() == "BackupCredentialUnlabelled", 60)
    cond = archiving(kube, ns, "thief")
    assert "admin-key" in cond["message"] and "spec.backup.s3.credentials.secretName" in cond["message"]
    warnings = [e for e in events(kube, ns, "PostgresCluster", "thief") if e["type"] == "Warning"]
    assert any(e["reason"] == "BackupCredentialUnlabelled" for e in warnings), warnings
    # The pods get no reference to it either.
    sts = get_or_none(kube, "statefulset", "thief", "-n", ns)
    assert sts is not None
    env = [e for c in sts["spec"]["template"]["spec"]["containers"] for e in c.get("env") or ()]
    assert not any((e.get("valueFrom") or {}).get("secretKeyRef", {}).get("name") == "admin-key" for e in env)
    assert hostile.connections == 0
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_plain_http_is_refused_without_the_flag(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server, hostile: SlowDrip
) -> None:
    """The operator as installed (no --allow-insecure-object-stores) sends nothing to an http://
    endpoint, even with a labelled Secret, and names the field. The module's operator (which allows
    plain HTTP for moto) steps aside meanwhile."""
    kube = operator_env.kube
    ns = make_namespace(kube, "plainhttp")
    operator.stop()
    strict = OperatorProcess(operator_env.kubeconfig, operator_env.log_dir, f"{operator.identity}-strict",
                             "--store-call-timeout", "5s", insecure_stores=False).start()  # fmt: skip
    try:
        strict.wait_leader(90)
        apply(kube, secret(ns, s3, "plain"))
        apply(kube, cluster("plain", ns, replicas=1, backup=backup_spec(hostile.endpoint)))

        def reason() -> Any:
            return archiving(kube, ns, "plain").get("reason")

        wait_until("the https refusal", lambda: reason() == "BackupEndpointInsecure", 90)
        assert "spec.backup.s3.endpointURL" in archiving(kube, ns, "plain")["message"]
        warnings = [e for e in events(kube, ns, "PostgresCluster", "plain") if e["type"] == "Warning"]
        assert any(e["reason"] == "BackupEndpointInsecure" for e in warnings), warnings
        sts = get_or_none(kube, "statefulset", "plain", "-n", ns)
        assert sts is not None
        env = [e for c in sts["spec"]["template"]["spec"]["containers"] for e in c.get("env") or ()]
        assert not any((e.get("valueFrom") or {}).get("secretKeyRef", {}).get("name") == "s3-creds"
                       for e in env)  # fmt: skip
        assert hostile.connections == 0
        kube.kubectl("delete", "namespace", ns, "--wait=false")
    finally:
        assert strict.stop() == 0
        operator.restart().wait_leader(90)


def test_a_restarted_operator_trusts_recorded_verdicts(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "restart")
    apply(kube, secret(ns, s3, "kept"))
    apply(kube, cluster("kept", ns, replicas=1, backup=backup_spec(s3.endpoint)))

    def recorded() -> dict[str, Any]:
        obj = get_or_none(kube, "postgresclusters.db.example.com", "kept", "-n", ns) or {}
        return dict(((obj.get("status") or {}).get("backup") or {}).get("storeOwnership") or {})

    wait_until("the verdict recorded in status", lambda: recorded().get("verdict") == "owned", 90)
    before = store_requests(s3, "kept")
    assert before >= 2
    operator.stop()
    operator.restart().wait_leader(90)
    # The restarted operator passes the cluster at once (its first listing) and every 30 s (kwok has no
    # pod to probe, so the pass comes back) ...
    time.sleep(40)
    # ... and asks the store nothing: the recorded verdict holds for the unchanged spec.backup.
    assert store_requests(s3, "kept") == before
    assert recorded().get("verdict") == "owned"
    kube.kubectl("delete", "namespace", ns, "--wait=false")
