"""Fixtures of the e2e tier (full profile): the operator as a user installs it, the user's example
cluster, the backup modules' S3 server and namespace, the synchronous cluster and the day-2 cluster.

Clusters are shared across modules where their tests leave them serving: a cluster's bring-up and
teardown cost more than most tests. `example` (orders-db, three instances) serves every module that asks
for it, `sync_cluster` (three instances, synchronous) the failover and settings modules, and `day2` (two
instances archiving to a store of their own, metrics open to the host) `kubectl pgc` and monitoring; each
stays until the session ends."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from harness.deployed_operator import E2E_OPERATOR_ARGS, EXAMPLE, EXAMPLE_NAMESPACE, install_operator
from harness.e2e_backup import BRIDGE_HOST, BUCKET, DAY2_NAME, Day2, Moto, backup_cluster, credentials, s3
from harness.e2e_monitoring import DAY2_QUERIES
from harness.failure_report import report
from harness.kube import apply_objects, get_json
from harness.local_cluster import Kube
from harness.objects import cluster
from harness.paths import REPO
from harness.pgcluster import SMALL, SYNC_NAME, SYNC_NAMESPACE, SYNC_SPEC, wait_serving
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
    """The operator installed with its Helm chart (images built locally, cached by their inputs)."""
    install_operator(full_kube, E2E_OPERATOR_ARGS)
    yield full_kube


@pytest.fixture(scope="session")
def example(operator: Kube) -> Iterator[Kube]:
    """examples/orders-db.yaml applied and Ready; modules using it leave it serving as they found it."""
    operator.kubectl("apply", "-f", str(REPO / "examples" / "orders-db.yaml"))
    operator.kubectl("-n", EXAMPLE_NAMESPACE, "wait", f"postgrescluster/{EXAMPLE}", "--for=condition=Ready",
                     "--timeout=900s", timeout=920)  # fmt: skip
    yield operator
    if answers(operator):  # not when the lifecycle test stopped the cluster before the session's end
        operator.kubectl("delete", "namespace", EXAMPLE_NAMESPACE, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="session")
def sync_cluster(operator: Kube) -> Iterator[Kube]:
    """SYNC_NAME in SYNC_NAMESPACE serving (harness/pgcluster.py); modules leave it serving."""
    operator.kubectl("create", "namespace", SYNC_NAMESPACE)
    body = cluster(SYNC_NAME, SYNC_NAMESPACE, **{"resources": SMALL, **SYNC_SPEC})
    operator.kubectl("apply", "-f", "-", input=json.dumps(body))
    wait_serving(operator, SYNC_NAMESPACE, SYNC_NAME, int(SYNC_SPEC["replicas"]), 900)
    yield operator
    if answers(operator):
        operator.kubectl("delete", "namespace", SYNC_NAMESPACE, "--ignore-not-found", "--wait=false")


def answers(kube: Kube) -> bool:
    return kube.kubectl("get", "--raw", "/readyz", check=False, timeout=15).returncode == 0


@contextmanager
def _store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    with s3_server(tmp_path_factory.mktemp("moto"), bind="0.0.0.0", user="e2e") as server:  # noqa: S104
        server_ = Moto(server)
        server_.client().create_bucket(Bucket=BUCKET)
        yield server_


@contextmanager
def _store_namespace(operator: Kube) -> Iterator[str]:
    """A namespace for clusters with backups; each cluster brings its own credentials Secret
    (e2e_backup.credentials)."""
    name = f"bk-{uuid.uuid4().hex[:6]}"
    operator.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        if answers(operator):  # not when the session's cluster was stopped already
            _release_and_delete(operator, name)


def _release_and_delete(operator: Kube, namespace: str) -> None:
    # Clusters whose store is gone must not hold the namespace: release them by hand first.
    for item in get_json(operator, "pgc", "-n", namespace)["items"]:
        release = ("db.example.com/release-backup-store=true", "--overwrite")
        operator.kubectl("annotate", "pgc", item["metadata"]["name"], "-n", namespace, *release, check=False)
    # Not waited for (a module's teardown took ~50 s here): released, the clusters need not reach the store.
    operator.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    """The backup modules' S3 server (one per module), on every address so the pods reach it."""
    with _store(tmp_path_factory) as server:
        yield server


@pytest.fixture(scope="module")
def ns(operator: Kube, moto: Moto) -> Iterator[str]:
    """The backup modules' namespace (one per module); a module creates each cluster's credentials Secret
    with the cluster (e2e_backup.credentials). (test_localkube_full has an `ns` of its own.)"""
    with _store_namespace(operator) as name:
        yield name


@pytest.fixture(scope="session")
def day2(operator: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Day2]:
    """Two instances archiving every 10 s to a store of their own, the metrics port open to the host
    (where the tests' Prometheus runs) and every namespace. Modules leave it serving, its store's
    credentials working; they may switch it over, restart it and take backups."""
    with _store(tmp_path_factory) as moto, _store_namespace(operator) as namespace:
        store = {"s3": s3(moto, DAY2_NAME), "archiveTimeout": "10s", "onDelete": "delete"}
        policy = {"metricsFrom": [{"ipBlock": {"cidr": f"{BRIDGE_HOST}/32"}}, {"namespaceSelector": {}}]}
        # The monitoring module's custom queries (docs/monitoring.md#custom-metrics), from creation on.
        monitoring = {"customQueries": {"configMapName": DAY2_QUERIES.name, "key": DAY2_QUERIES.key}}
        apply_objects(
            operator,
            credentials(moto, namespace, DAY2_NAME),
            DAY2_QUERIES.configmap(namespace),
            backup_cluster(
                DAY2_NAME, namespace, 2, backup=store, networkPolicy=policy, monitoring=monitoring
            ),
        )
        wait_serving(operator, namespace, DAY2_NAME, 2, 900)
        yield Day2(namespace, DAY2_NAME, moto)
