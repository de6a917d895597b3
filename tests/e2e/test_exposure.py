"""spec.services on real pods (full profile): an additional NodePort Service declared on the user's
example cluster is reachable from the host at the node's address and the fixed node port, with TLS
verified against the cluster's CA under the host name the user declared (and the node address, also
declared); the server certificate follows the declaration without a restart, and the Service goes when
the declaration does. The example cluster is left as it was found."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE
from harness.kube import get_json, get_or_none
from harness.local_cluster import Kube
from harness.pgcluster import secret
from harness.waiting import wait_until

NODE_PORT = 30543
DECLARED_HOST = "orders.db.example.test"
EXTERNAL = f"{EXAMPLE}-external"


def node_address(kube: Kube) -> str:
    (node,) = get_json(kube, "nodes")["items"]
    (address,) = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
    return str(address)


def patch_services(kube: Kube, services: dict[str, Any]) -> None:
    body = json.dumps({"spec": {"services": services}})
    kube.kubectl("patch", "pgc", EXAMPLE, "-n", EXAMPLE_NAMESPACE, "--type=merge", "-p", body)


@pytest.fixture(scope="module")
def exposed(example: Kube) -> Iterator[str]:
    """The example cluster with an additional NodePort Service in front of its primary; removed after."""
    address = node_address(example)
    extra = {"name": EXTERNAL, "type": "NodePort", "nodePort": NODE_PORT, "hosts": [DECLARED_HOST, address]}
    patch_services(example, {"additional": [extra]})
    try:
        yield address
    finally:
        example.kubectl(
            "patch",
            "pgc",
            EXAMPLE,
            "-n",
            EXAMPLE_NAMESPACE,
            "--type=json",
            "-p",
            '[{"op":"remove","path":"/spec/services"}]',
        )


def connect(kube: Kube, ca: Path, host: str, address: str) -> psycopg.Connection[Any]:
    app = secret(kube, EXAMPLE_NAMESPACE, f"{EXAMPLE}-app")
    return psycopg.connect(
        host=host,
        hostaddr=address,
        port=NODE_PORT,
        user=app["username"],
        password=app["password"],
        dbname=app["dbname"],
        sslmode="verify-full",
        sslrootcert=str(ca),
        connect_timeout=5,
        autocommit=True,
    )


def test_a_node_port_service_is_reachable_from_the_host_with_tls_verified_under_the_declared_name(
    example: Kube, exposed: str, tmp_path: Path
) -> None:
    kube, address = example, exposed
    service = wait_until(
        f"Service {EXTERNAL}", lambda: get_or_none(kube, "service", EXTERNAL, "-n", EXAMPLE_NAMESPACE), 60
    )
    assert service["spec"]["type"] == "NodePort" and service["spec"]["ports"][0]["nodePort"] == NODE_PORT
    ca = tmp_path / "ca.crt"
    ca.write_text(secret(kube, EXAMPLE_NAMESPACE, f"{EXAMPLE}-ca")["ca.crt"])

    # The certificate is re-issued with the declared names and the instances reload it: until then a
    # verified connection is refused, which is what the wait is for.
    def primary_over_node_port(host: str) -> bool:
        with connect(kube, ca, host, address) as conn:
            row = conn.execute("SELECT pg_is_in_recovery(), current_setting('ssl')").fetchone()
        return row == (False, "on")

    wait_until(
        f"{DECLARED_HOST} at {address}:{NODE_PORT}, verified",
        lambda: primary_over_node_port(DECLARED_HOST),
        180,
        2,
    )
    assert primary_over_node_port(address)  # the declared address is in the certificate too
    with pytest.raises(psycopg.OperationalError, match=r"certificate|does not match"):
        connect(kube, ca, "undeclared.example.test", address).close()


def test_the_service_goes_with_its_declaration(example: Kube, exposed: str) -> None:
    patch_services(example, {"additional": []})
    wait_until(
        f"Service {EXTERNAL} deleted",
        lambda: get_or_none(example, "service", EXTERNAL, "-n", EXAMPLE_NAMESPACE) is None,
        60,
    )
