"""A real PostgreSQL cluster on the full profile: the operator installed from deploy/ (its image built
locally), the user's example applied, Patroni electing a primary and two streaming replicas, and an
application connecting with the `<name>-app` Secret."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from conftest import REPO, Kube
from pg_operator.images import default_image

OPERATOR_NAMESPACE = "pg-operator-system"
NAMESPACE, NAME = "shop", "orders-db"


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 2.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (AssertionError, psycopg.Error) as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def get_json(kube: Kube, *args: str) -> Any:
    return json.loads(kube.kubectl("get", "-o", "json", *args).stdout)


def secret(kube: Kube, name: str) -> dict[str, str]:
    data = get_json(kube, "secret", name, "-n", NAMESPACE)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def service_ip(kube: Kube, name: str) -> str:
    return str(get_json(kube, "service", name, "-n", NAMESPACE)["spec"]["clusterIP"])


def connect(kube: Kube, service: str) -> psycopg.Connection[Any]:
    app = secret(kube, f"{NAME}-app")
    return psycopg.connect(host=service_ip(kube, service), port=int(app["port"]), user=app["username"],
                           password=app["password"], dbname=app["dbname"], connect_timeout=5,
                           autocommit=True)


@pytest.fixture(scope="module")
def operator(full_kube: Kube) -> Iterator[Kube]:
    """The operator as a user runs it: CRD and Deployment from deploy/, image built locally."""
    import sys

    sys.path.insert(0, str(REPO / "localkube" / "images"))
    from build import ensure_images

    containers = _deployment()["spec"]["template"]["spec"]["containers"]
    operator_image = next(c["image"] for c in containers if c["name"] == "operator")
    ensure_images(full_kube.ctx, [default_image("16"), operator_image])
    full_kube.kubectl("apply", "-k", str(REPO / "deploy"))
    full_kube.kubectl("-n", OPERATOR_NAMESPACE, "rollout", "status", "deployment/pg-operator",
                      "--timeout=300s", timeout=320)
    yield full_kube
    full_kube.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=300)


def _deployment() -> dict[str, Any]:
    import yaml

    for doc in yaml.safe_load_all((REPO / "deploy" / "operator" / "deployment.yaml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            return dict(doc)
    raise AssertionError("deploy/operator/deployment.yaml has no Deployment")


@pytest.fixture(scope="module")
def example(operator: Kube) -> Kube:
    operator.kubectl("apply", "-f", str(REPO / "examples" / "orders-db.yaml"))
    operator.kubectl("-n", NAMESPACE, "wait", f"postgrescluster/{NAME}", "--for=condition=Ready",
                     "--timeout=900s", timeout=920)
    return operator


def test_example_becomes_ready_with_one_primary_and_two_streaming_replicas(example: Kube) -> None:
    status = get_json(example, "pgc", NAME, "-n", NAMESPACE)["status"]
    roles = sorted(i["role"] for i in status["instances"])
    assert roles == ["primary", "replica", "replica"], status
    assert status["readyReplicas"] == 3 and status["currentPrimary"]
    with psycopg.connect(host=_pod_ip(example, status["currentPrimary"]), port=5432, user="postgres",
                         password=secret(example, f"{NAME}-superuser")["password"], dbname="postgres",
                         connect_timeout=5) as conn:
        states = [r[0] for r in conn.execute("select state from pg_stat_replication").fetchall()]
    assert states == ["streaming", "streaming"], states
    printed = example.kubectl("get", "pgc", "-n", NAMESPACE).stdout
    assert NAME in printed and status["currentPrimary"] in printed, printed


def _pod_ip(kube: Kube, pod: str) -> str:
    return str(get_json(kube, "pod", pod, "-n", NAMESPACE)["status"]["podIP"])


def test_application_writes_through_rw_and_reads_through_ro(example: Kube) -> None:
    with connect(example, f"{NAME}-rw") as rw:
        assert rw.execute("select pg_is_in_recovery()").fetchone() == (False,)
        rw.execute("create table if not exists orders (id serial primary key, item text not null)")
        rw.execute("insert into orders (item) select 'item-' || g from generate_series(1, 100) g")
        written = rw.execute("select count(*) from orders").fetchone()
    assert written is not None

    def replica_has_rows() -> bool:
        with connect(example, f"{NAME}-ro") as ro:
            assert ro.execute("select pg_is_in_recovery()").fetchone() == (True,)
            return ro.execute("select count(*) from orders").fetchone() == written

    wait_until("the rows to reach a replica through -ro", replica_has_rows, timeout=60)


def test_app_secret_uri_works_as_given(example: Kube) -> None:
    app = secret(example, f"{NAME}-app")
    # The URI names the Service's DNS name; the host resolves ClusterIPs only, so swap in the IP.
    host = app["host"]
    uri = app["uri"].replace(host, service_ip(example, f"{NAME}-rw"))
    with psycopg.connect(uri, connect_timeout=5) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == (
            app["username"], app["dbname"])
