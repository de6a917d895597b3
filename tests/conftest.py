"""Fixtures the tiers share: the local cluster profile a tier needs, started for the session or reused.

Tiers run in the order unit → integration (kwok profile) → e2e (full profile), so one test run switches
profile at most once. A cluster this session started is stopped at the end (PGOP_KEEP_CLUSTER=1 keeps
it); one that was already running is reused and left as it was, unless a tier needs the other profile.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
LOCALKUBE = REPO / "localkube"
sys.path.insert(0, str(REPO))  # the localkube package

from localkube.common import Context  # noqa: E402

from pg_operator.images import default_image, image_for  # noqa: E402

TIERS = ("unit", "integration", "e2e")


@dataclass
class Kube:
    """A running local cluster as tests see it."""

    profile: str
    kubeconfig: str
    ctx: Context = field(repr=False)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.ctx.bin / "kubectl"), "--kubeconfig", self.kubeconfig, *args]
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
        return res

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should talk to this cluster."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}


class ClusterManager:
    """Brings profiles up and down on behalf of the test session."""

    def __init__(self) -> None:
        self.ctx = Context()
        self.started: str | None = None

    def running(self) -> str | None:
        res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), "status"],
                             capture_output=True, text=True)
        if res.returncode != 0:
            return None
        for line in res.stdout.splitlines():
            if line.startswith("profile: "):
                return line.split(": ", 1)[1].strip()
        return None

    def _run(self, *args: str) -> None:
        res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), *args],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.fail(f"localkube {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}", pytrace=False)

    def ensure(self, profile: str) -> Kube:
        current = self.running()
        if current != profile:
            if current is not None:
                self._run("down")
            self._run("up", profile)
            self.started = profile
        return Kube(profile=profile, kubeconfig=str(self.ctx.admin_kubeconfig), ctx=self.ctx)

    def forget(self) -> None:
        """A test stopped the cluster itself: nothing is left for the session to stop."""
        self.started = None

    def finish(self) -> None:
        if self.started and os.environ.get("PGOP_KEEP_CLUSTER") != "1":
            self._run("down")


@pytest.fixture(scope="session")
def cluster_manager() -> Iterator[ClusterManager]:
    manager = ClusterManager()
    yield manager
    manager.finish()


@pytest.fixture(scope="session")
def kube(cluster_manager: ClusterManager) -> Kube:
    """The kwok profile: real control plane, fake nodes."""
    return cluster_manager.ensure("kwok")


@pytest.fixture(scope="session")
def full_kube(cluster_manager: ClusterManager) -> Kube:
    """The full profile: real control plane and a real node running real containers."""
    return cluster_manager.ensure("full")


# --- e2e: the operator as a user installs it, and the user's example cluster -----------------------------

OPERATOR_NAMESPACE = "pg-operator-system"
EXAMPLE_NAMESPACE, EXAMPLE = "shop", "orders-db"


def operator_image() -> str:
    for doc in yaml.safe_load_all((REPO / "deploy" / "operator" / "deployment.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
            return str(next(c["image"] for c in containers if c["name"] == "operator"))
    raise AssertionError("deploy/operator/deployment.yaml has no Deployment")


@pytest.fixture(scope="session")
def operator(full_kube: Kube) -> Iterator[Kube]:
    """CRD, RBAC and Deployment from deploy/, with images built locally (cached by their inputs)."""
    install_operator(full_kube)
    yield full_kube


def install_operator(kube: Kube) -> None:
    """What a user does (kubectl apply -k deploy/), after building and importing the images."""
    from localkube.images.containerd import ensure_images

    ensure_images(kube.ctx, [default_image("16"), image_for("16.13"), operator_image()])
    kube.kubectl("apply", "-k", str(REPO / "deploy"))
    kube.kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pg-operator",
                 "--timeout=300s", timeout=320)


@pytest.fixture(scope="module")
def example(operator: Kube) -> Iterator[Kube]:
    """examples/orders-db.yaml applied and Ready."""
    operator.kubectl("apply", "-f", str(REPO / "examples" / "orders-db.yaml"))
    operator.kubectl("-n", EXAMPLE_NAMESPACE, "wait", f"postgrescluster/{EXAMPLE}", "--for=condition=Ready",
                     "--timeout=900s", timeout=920)
    yield operator
    operator.kubectl("delete", "namespace", EXAMPLE_NAMESPACE, "--ignore-not-found", timeout=300)


def _tier(item: pytest.Item) -> str:
    rel = Path(str(item.fspath)).relative_to(REPO / "tests")
    return rel.parts[0] if rel.parts[0] in TIERS else "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Mark by directory so `-m integration` / `-m e2e` select whole tiers, and order the tiers so the
    # cluster switches profile at most once per run.
    for item in items:
        tier = _tier(item)
        if tier != "unit":
            item.add_marker(getattr(pytest.mark, tier))
    # Tests that stop the cluster (marked cluster_lifecycle) run last within their tier.
    def order(item: pytest.Item) -> tuple[int, bool]:
        return TIERS.index(_tier(item)), item.get_closest_marker("cluster_lifecycle") is not None

    items.sort(key=order)
