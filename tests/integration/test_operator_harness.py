"""Shared plumbing for the operator's integration tests and the scale benchmark (no tests in here).

The operator runs as a subprocess with its own identity: the ServiceAccount and RBAC of deploy/operator,
a kubeconfig holding a token of that ServiceAccount. Its writes are counted from the API server's audit
log by that user. kwok has no storage, so `PvProvisioner` plays the volume provisioner: it creates a
pre-bound PersistentVolume for every pending claim of a PostgresCluster (the PV controller binds them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import yaml

REPO = Path(__file__).resolve().parents[2]
PG_OPERATOR = REPO / ".venv" / "bin" / "pg-operator"
STATE = Path(os.environ.get("PGOP_STATE", "/var/lib/pg-operator-localkube"))
AUDIT_LOG = STATE / "logs" / "audit.log"
OPERATOR_NS = "pg-operator-system"
OPERATOR_SA = "pg-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
CLUSTER_LABEL = "db.example.com/cluster"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


class KubectlLike(Protocol):
    """What the harness needs from the `kube` fixture (tests/conftest.py's Kube)."""

    kubeconfig: str

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # a transient kubectl failure is retried until the deadline
            last_exc = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else "")
    )


def get_json(kube: Any, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def get_or_none(kube: Any, *args: str) -> Any:
    res = kube.kubectl("get", *args, "-o", "json", check=False)
    if res.returncode != 0:
        if "NotFound" in res.stderr:
            return None
        raise AssertionError(res.stderr)
    return json.loads(res.stdout)


def apply(kube: Any, obj: Any) -> None:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    kube.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_operator_identity(kube: Any) -> None:
    """CRD, the operator's Namespace, ServiceAccount and RBAC, exactly as deployed (not the Deployment)."""
    # Other tests apply the CRD under their own field manager: the committed file wins.
    kube.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(REPO / "deploy" / "crd" / "postgresclusters.yaml"),
    )
    kube.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/postgresclusters.db.example.com"
    )
    for name in ("namespace.yaml", "rbac.yaml"):
        kube.kubectl("apply", "--server-side", "-f", str(REPO / "deploy" / "operator" / name))


def operator_kubeconfig(kube: Any, path: Path) -> Path:
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


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies, so a killed test session leaves
    no operator behind (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class OperatorProcess:
    """`pg-operator run` as a subprocess, with its own health/metrics ports and log file."""

    def __init__(self, kubeconfig: Path, log_dir: Path, identity: str, *extra: str) -> None:
        self.kubeconfig = kubeconfig
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
                *self.extra,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _get(self, port: int, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def readyz(self) -> int:
        return self._get(self.health_port, "/readyz")[0]

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as {'name{labels}': value}."""
        _, text = self._get(self.metrics_port, "/metrics")
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


@dataclasses.dataclass(frozen=True)
class AuditMark:
    stamp: str  # UTC, as the audit log writes requestReceivedTimestamp
    inode: int
    size: int


class Audit:
    """Counts what one user wrote, from the API server's audit log (JSON lines, ResponseComplete)."""

    def __init__(self, path: Path = AUDIT_LOG, user: str = OPERATOR_USER) -> None:
        self.path = path
        self.user = user

    def mark(self) -> AuditMark:
        try:
            st = self.path.stat()
            inode, size = st.st_ino, st.st_size
        except FileNotFoundError:
            inode, size = 0, 0
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        return AuditMark(stamp, inode, size)

    def _lines_since(self, mark: AuditMark) -> Iterator[bytes]:
        st = self.path.stat()
        if st.st_ino == mark.inode and st.st_size >= mark.size:
            with self.path.open("rb") as f:
                f.seek(mark.size)
                yield from f
            return
        # The API server rotated the log since the mark: read the rotated files written since, then the
        # current one, and keep what was received after the mark.
        rotated = sorted(
            p
            for p in self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}")
            if p.stat().st_mtime >= st.st_mtime - 86400
        )
        for path in [*rotated, self.path]:
            with path.open("rb") as f:
                yield from f

    def events_since(self, mark: AuditMark) -> Iterator[dict[str, Any]]:
        needle = self.user.encode()
        for raw in self._lines_since(mark):
            if needle not in raw:
                continue
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if (
                event.get("stage") == "ResponseComplete"
                and (event.get("user") or {}).get("username") == self.user
                and str(event.get("requestReceivedTimestamp", "")) >= mark.stamp
            ):
                yield event

    def requests_since(
        self, mark: AuditMark, *, include_leases: bool = False, namespace: str | None = None
    ) -> Counter[tuple[str, str]]:
        """(verb, resource[/subresource]) → count; the leader Lease's renewals are left out unless asked;
        with `namespace`, only requests about objects in it."""
        out: Counter[tuple[str, str]] = Counter()
        for event in self.events_since(mark):
            ref = event.get("objectRef") or {}
            if namespace is not None and ref.get("namespace") != namespace:
                continue
            resource = str(ref.get("resource") or event.get("requestURI"))
            if resource == "leases" and not include_leases:
                continue
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            out[(str(event.get("verb")), resource)] += 1
        return out

    def writes_since(self, mark: AuditMark, namespace: str | None = None) -> Counter[tuple[str, str]]:
        requests = self.requests_since(mark, namespace=namespace)
        return Counter({k: v for k, v in requests.items() if k[0] in WRITE_VERBS})

    def settled(self, quiet: float = 3.0, timeout: float = 60.0, namespace: str | None = None) -> AuditMark:
        """A mark taken once the user has written nothing for `quiet` seconds: the start of a steady
        state. The follow-up writes of a change (a status write, an Event) land within moments on a quiet
        machine and later on a loaded one; a user that never stops writing fails here, naming what."""
        deadline = time.monotonic() + timeout
        while True:
            mark = self.mark()
            time.sleep(quiet)
            writes = self.writes_since(mark, namespace)
            if not writes:
                return mark
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.user} kept writing for {timeout:.0f} s: {dict(writes)}")


class PvProvisioner:
    """Stands in for a volume provisioner where there is none: a PersistentVolume, pre-bound, for each
    pending claim that carries the cluster label and whose class no provisioner serves. Uses the admin
    kubeconfig (lightkube, sync, one watch)."""

    def __init__(self, kubeconfig: str) -> None:
        from lightkube import Client, KubeConfig

        self.client = Client(KubeConfig.from_file(kubeconfig), field_manager="test-provisioner")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pv-provisioner", daemon=True)
        self.created = 0

    def __enter__(self) -> PvProvisioner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _served_by_a_provisioner(self, class_name: str | None) -> bool:
        """A class with a real provisioner (the full profile's hostpath one, or a kwok profile that has
        one) is left to it; only classes nobody provisions, or no class at all, are served here."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.storage_v1 import StorageClass

        if not class_name:
            return False
        try:
            klass = self.client.get(StorageClass, class_name)
        except ApiError:
            return False
        return klass.provisioner != "kubernetes.io/no-provisioner"

    def _provision(self, pvc: Any) -> None:
        from lightkube.core.exceptions import ApiError
        from lightkube.models.core_v1 import (
            HostPathVolumeSource,
            ObjectReference,
            PersistentVolumeSpec,
        )
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import PersistentVolume

        if pvc.spec.volumeName or (pvc.status and pvc.status.phase == "Bound"):
            return
        if self._served_by_a_provisioner(pvc.spec.storageClassName):
            return
        meta = pvc.metadata
        size = (pvc.spec.resources.requests or {}).get("storage", "1Gi")
        pv = PersistentVolume(
            metadata=ObjectMeta(
                name=f"kwok-{meta.uid}", labels={CLUSTER_LABEL: meta.labels.get(CLUSTER_LABEL, "")}
            ),
            spec=PersistentVolumeSpec(
                capacity={"storage": size},
                accessModes=pvc.spec.accessModes or ["ReadWriteOnce"],
                storageClassName=pvc.spec.storageClassName or "",
                persistentVolumeReclaimPolicy="Delete",
                hostPath=HostPathVolumeSource(path=f"/tmp/kwok-pv/{meta.uid}"),
                claimRef=ObjectReference(namespace=meta.namespace, name=meta.name, uid=meta.uid),
            ),
        )
        try:
            self.client.create(pv)
            self.created += 1
        except ApiError as exc:
            if exc.status.code != 409:
                raise

    def _run(self) -> None:
        from lightkube import operators
        from lightkube.resources.core_v1 import PersistentVolumeClaim

        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for kind, pvc in self.client.watch(
                    PersistentVolumeClaim, namespace="*", labels={CLUSTER_LABEL: operators.exists()}
                ):
                    if self._stop.is_set():
                        return
                    if kind in ("ADDED", "MODIFIED"):
                        with contextlib.suppress(Exception):
                            self._provision(pvc)
            time.sleep(0.5)


def label_roles(kube: Any, namespace: str, cluster: str) -> None:
    """Do what Patroni does in real pods (no process runs on kwok): role=primary on the first instance,
    role=replica on the others."""
    pods = get_json(kube, "pods", "-n", namespace, "-l", f"{CLUSTER_LABEL}={cluster}")["items"]
    for pod in pods:
        name = pod["metadata"]["name"]
        role = "primary" if name == f"{cluster}-0" else "replica"
        if (pod["metadata"].get("labels") or {}).get("role") != role:
            kube.kubectl("label", "pod", name, "-n", namespace, f"role={role}", "--overwrite")


def condition(obj: Any, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def events_for(kube: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    items = get_json(
        kube,
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind=PostgresCluster,involvedObject.name={name}",
    )
    return list(items["items"])


# --- fixtures shared by the operator's test modules (imported there) ----------------------------------

import pytest  # noqa: E402


class ExternalKube:
    """A cluster given by $PGOP_TEST_KUBECONFIG (another real API server), for developing these tests;
    normally the session's `kube` fixture (tests/conftest.py) is used."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl_bin = os.environ.get(
            "PGOP_KUBECTL", str(Path.home() / ".cache/pg-operator/current/kubectl")
        )

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
        return res


@dataclasses.dataclass
class OperatorEnv:
    kube: Any
    kubeconfig: Path
    log_dir: Path
    audit: Audit


@pytest.fixture(scope="session")
def operator_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorEnv]:
    external = os.environ.get("PGOP_TEST_KUBECONFIG")
    kube = ExternalKube(external) if external else request.getfixturevalue("kube")
    audit_path = Path(os.environ.get("PGOP_TEST_AUDIT_LOG", str(AUDIT_LOG)))
    assert audit_path.exists(), f"the API server's audit log {audit_path} is missing"
    install_operator_identity(kube)
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = operator_kubeconfig(kube, work / "operator.kubeconfig")
    with PvProvisioner(kube.kubeconfig):
        yield OperatorEnv(kube, kubeconfig, work, Audit(audit_path))


# Identities are unique to the test session: a process left over from another session must never share
# one with ours (two processes of one identity would both believe they hold the Lease).
SESSION = uuid.uuid4().hex[:6]


def start_operator(env: OperatorEnv, identity: str, *extra: str) -> OperatorProcess:
    return OperatorProcess(env.kubeconfig, env.log_dir, f"{identity}-{SESSION}", *extra).start()


def make_namespace(kube: Any, prefix: str) -> str:
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ns)
    return ns


def postgres_cluster(name: str, namespace: str, replicas: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "version": "16", "storage": "1Gi", **spec},
    }
