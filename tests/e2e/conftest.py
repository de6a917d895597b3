"""Fixtures of the e2e tier (full profile): the operator as a user installs it, the user's example
cluster, and the backup modules' S3 server and namespace."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator

import pytest

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE, install_operator
from harness.e2e_backup import BUCKET, Moto
from harness.failure_report import report
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.objects import s3_credentials_secret
from harness.paths import REPO
from harness.s3 import s3_server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed e2e test carries the cluster's state with it: CI shows only the test output."""
    outcome = yield
    result = outcome.get_result()
    kube = next((v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Kube)), None)
    if result.failed and kube is not None and kube.profile == "full":
        result.sections.append(("cluster state at the failure", report(kube)))


@pytest.fixture(scope="session")
def operator(full_kube: Kube) -> Iterator[Kube]:
    """CRD, RBAC and Deployment from deploy/, with images built locally (cached by their inputs)."""
    install_operator(full_kube)
    yield full_kube


@pytest.fixture(scope="module")
def example(operator: Kube) -> Iterator[Kube]:
    """examples/orders-db.yaml applied and Ready."""
    operator.kubectl("apply", "-f", str(REPO / "examples" / "orders-db.yaml"))
    operator.kubectl("-n", EXAMPLE_NAMESPACE, "wait", f"postgrescluster/{EXAMPLE}", "--for=condition=Ready",
                     "--timeout=900s", timeout=920)  # fmt: skip
    yield operator
    operator.kubectl("delete", "namespace", EXAMPLE_NAMESPACE, "--ignore-not-found", timeout=300)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """The backup modules' S3 server (one per module), on every address so the pods reach it."""
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    with s3_server(tmp_path_factory.mktemp("moto"), bind="0.0.0.0", user="e2e") as server:  # noqa: S104
        server_ = Moto(server)
        server_.client().create_bucket(Bucket=BUCKET)
        yield server_


@pytest.fixture(scope="module")
def ns(operator: Kube, moto: Moto) -> Iterator[str]:
    """The backup modules' namespace (one per module), with the store's credentials Secret `s3-creds`
    and `s3-wrong` (a wrong secret key). (test_localkube_full has an `ns` of its own.)"""
    name = f"bk-{uuid.uuid4().hex[:6]}"
    operator.kubectl("create", "namespace", name)
    for secret_name, secret_key in (("s3-creds", moto.secret_access_key), ("s3-wrong", "not-the-secret-key")):
        body = s3_credentials_secret(secret_name, name, moto.access_key_id, secret_key)
        operator.kubectl("apply", "-f", "-", input=json.dumps(body))
    yield name
    # Clusters whose store is gone must not hold the namespace: release them by hand first.
    for item in get_json(operator, "pgc", "-n", name)["items"]:
        operator.kubectl("annotate", "pgc", item["metadata"]["name"], "-n", name,
                         "db.example.com/release-backup-store=true", "--overwrite", check=False)  # fmt: skip
    operator.kubectl("delete", "namespace", name, "--ignore-not-found", timeout=300)
