"""The operator as a subprocess (`pg-operator run`) with its own identity: the ServiceAccount and RBAC
of deploy/operator, a kubeconfig holding a token of that ServiceAccount, its own health/metrics ports
and log file. For the integration tests (one process per module, or several) and the benchmarks."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from harness.kube import KubectlLike, wait_established
from harness.net import free_port, http_get
from harness.paths import REPO
from harness.processes import die_with_parent
from harness.waiting import wait_until

if TYPE_CHECKING:
    from harness.audit import Audit

PG_OPERATOR = REPO / ".venv" / "bin" / "pg-operator"
OPERATOR_NS = "pg-operator-system"
OPERATOR_SA = "pg-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
# Identities are unique to the process (the test session, the bench run): a process left over from
# another session must never share one with ours (two processes of one identity would both believe they
# hold the Lease).
SESSION = uuid.uuid4().hex[:6]


def install_operator_identity(kube: KubectlLike) -> None:
    """CRD, the operator's Namespace, ServiceAccount and RBAC, exactly as deployed (not the Deployment)."""
    # Other tests apply the CRD under their own field manager: the committed file wins.
    kube.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(REPO / "deploy" / "crd" / "postgresclusters.yaml"),
    )
    wait_established(kube, "crd/postgresclusters.db.example.com")
    for name in ("namespace.yaml", "rbac.yaml"):
        kube.kubectl("apply", "--server-side", "-f", str(REPO / "deploy" / "operator" / name))


def operator_kubeconfig(kube: KubectlLike, path: Path) -> Path:
    """A kubeconfig for the operator's ServiceAccount, from a token the API server issues for it."""
    token = kube.kubectl("create", "token", OPERATOR_SA, "-n", OPERATOR_NS, "--duration=4h").stdout.strip()
    admin = yaml.safe_load(Path(kube.kubeconfig).read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": OPERATOR_SA, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": OPERATOR_SA}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class OperatorProcess:
    """`pg-operator run` as a subprocess, with its own health/metrics ports and log file."""

    def __init__(
        self, kubeconfig: Path, log_dir: Path, identity: str, *extra: str, insecure_stores: bool = True
    ) -> None:
        self.kubeconfig = kubeconfig
        # The tests' S3 emulator (harness/s3.py) speaks plain HTTP, which the operator refuses by default.
        self.insecure_stores = insecure_stores
        self.identity = identity
        self.extra = list(extra)
        self.log_path = log_dir / f"operator-{identity}.log"
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        env.pop("POD_NAME", None)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                str(PG_OPERATOR),
                "run",
                "--identity",
                self.identity,
                "--lease-namespace",
                OPERATOR_NS,
                "--health-port",
                str(self.health_port),
                "--metrics-port",
                str(self.metrics_port),
                "--bind-address",
                "127.0.0.1",
                *(("--allow-insecure-object-stores",) if self.insecure_stores else ()),
                *self.extra,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        log.close()
        return self

    def restart(self) -> OperatorProcess:
        """Start it again once it has exited (or was killed), on fresh ports, appending to its log."""
        assert not self.alive(), f"operator {self.identity} is still running"
        self.health_port, self.metrics_port = free_port(), free_port()
        return self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _get(self, port: int, path: str) -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{port}{path}")

    def readyz(self) -> int:
        return self._get(self.health_port, "/readyz")[0]

    def metrics_text(self) -> str:
        """/metrics as served (the Prometheus text format)."""
        return self._get(self.metrics_port, "/metrics")[1]

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as {'name{labels}': value}."""
        text = self.metrics_text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric(self, name: str) -> float:
        try:
            return self.metrics().get(name, 0.0)
        except OSError:
            return 0.0

    def is_leader(self) -> bool:
        return self.alive() and self.metric("pg_operator_leader") == 1.0

    def wait_leader(self, timeout: float = 60) -> None:
        def check() -> bool:
            if not self.alive():
                raise AssertionError(f"operator {self.identity} exited:\n{self.log_text()[-3000:]}")
            return self.is_leader() and self.readyz() == 200

        wait_until(f"operator {self.identity} to lead and be ready", check, timeout)

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill9(self) -> None:
        if self.proc is not None and self.alive():
            self.proc.kill()
            self.proc.wait(10)


def reconcile_passes(op: OperatorProcess) -> float:
    """Reconcile passes so far, of every result."""
    return sum(v for k, v in op.metrics().items() if k.startswith("pg_operator_reconcile_total{"))


@dataclasses.dataclass
class OperatorEnv:
    """What every operator process of a test session shares: the cluster, the ServiceAccount's
    kubeconfig, a directory for the logs, the audit log reader."""

    kube: Any
    kubeconfig: Path
    log_dir: Path
    audit: Audit


def start_operator(env: OperatorEnv, identity: str, *extra: str) -> OperatorProcess:
    """A new operator process, identity `<identity>-<SESSION>`, started (not yet leading)."""
    return OperatorProcess(env.kubeconfig, env.log_dir, f"{identity}-{SESSION}", *extra).start()


@dataclasses.dataclass(frozen=True)
class OperatorSpec:
    """A test module's operator: its identity, its flags, the CRD files applied before it starts (it
    resolves its resources once, at start) and what its log must not contain when it stops."""

    identity: str
    flags: tuple[str, ...] = ()
    crds: tuple[str, ...] = ()
    log_must_not_contain: tuple[str, ...] = ()


@contextlib.contextmanager
def leading_operator(env: OperatorEnv, spec: OperatorSpec) -> Iterator[OperatorProcess]:
    """The operator of `spec`, started and leading; stopped afterwards, which must be clean (exit 0 and
    none of the forbidden log lines)."""
    if spec.crds:
        files = [a for path in spec.crds for a in ("-f", str(REPO / path))]
        env.kube.kubectl("apply", "--server-side", "--force-conflicts", *files)
        names = [f"crd/{Path(path).stem}.db.example.com" for path in spec.crds]
        wait_established(env.kube, *names)
    proc = start_operator(env, spec.identity, *spec.flags)
    proc.wait_leader()
    try:
        yield proc
    finally:
        code = proc.stop()
    log = proc.log_text()
    assert code == 0, f"operator did not stop cleanly:\n{log[-3000:]}"
    for text in spec.log_must_not_contain:
        assert text not in log, log[-5000:]
