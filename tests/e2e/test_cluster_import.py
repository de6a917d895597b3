"""spec.bootstrap.import on real pods: an external PostgreSQL 15 server, run as a plain pod the operator
does not manage (the project's postgres 15 image with a plain `postgres` command), seeded with two
databases, roles, tables, a sequence and an index; one database imported microservice-style into a new
17 cluster (rows, sequences, the index and the owner compared), and an import with a wrong password,
which leaves its cluster not Ready with ImportFailed, a Warning Event, and the source untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from localkube.images.containerd import ensure_images

from harness.e2e_backup import superuser_sql
from harness.import_source import import_bootstrap, password_secret, source_sql, start_source
from harness.kube import events_for, get_json, make_namespace
from harness.local_cluster import Kube
from harness.objects import cluster
from harness.pgcluster import SMALL, status, wait_serving
from harness.waiting import wait_until
from pg_operator.images import default_image

pytestmark = pytest.mark.e2e

READER_PASSWORD = "reader-pass-e2e"
SEED_SHOP = """
CREATE TABLE customers (id bigserial PRIMARY KEY, name text NOT NULL UNIQUE);
CREATE TABLE orders (id bigserial PRIMARY KEY, customer bigint REFERENCES customers, total numeric(10,2),
                     placed timestamptz DEFAULT now());
CREATE INDEX orders_by_customer ON orders (customer, placed);
CREATE SEQUENCE invoice_numbers START 1000;
INSERT INTO customers (name) SELECT 'customer ' || g FROM generate_series(1, 50) g;
INSERT INTO orders (customer, total) SELECT 1 + g % 50, g * 1.25 FROM generate_series(1, 2000) g;
SELECT nextval('invoice_numbers') FROM generate_series(1, 17);
CREATE VIEW big_orders AS SELECT * FROM orders WHERE total > 100;
"""
# What both sides are compared on: rows, a checksum, and every sequence's position.
FINGERPRINT = (
    "SELECT (SELECT count(*) FROM orders) || ':' || (SELECT sum(total) FROM orders) || ':' || "
    "(SELECT count(*) FROM customers) || ':' || (SELECT last_value FROM invoice_numbers) || ':' || "
    "(SELECT last_value FROM orders_id_seq) || ':' || (SELECT count(*) FROM big_orders)"
)


@pytest.fixture(scope="module")
def source(operator: Kube) -> Iterator[tuple[Kube, str]]:
    """The namespace with the source server serving and seeded; the namespace goes afterwards."""
    ensure_images(operator.ctx, [default_image("15"), default_image("17")])
    ns = make_namespace(operator, "import")
    # Read-only access suffices: the import's role has pg_read_all_data (PostgreSQL 14+), no write grant.
    start_source(operator, ns, READER_PASSWORD)
    source_sql(operator, ns, "CREATE DATABASE shop")
    source_sql(operator, ns, "CREATE DATABASE analytics")
    source_sql(operator, ns, "CREATE ROLE shop_owner NOLOGIN")
    source_sql(operator, ns, SEED_SHOP, "shop")
    source_sql(operator, ns, "CREATE TABLE events (id int, what text); INSERT INTO events VALUES (1, 'x')",
               "analytics")  # fmt: skip
    yield operator, ns
    operator.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


def test_microservice_import_copies_rows_sequences_and_indexes(source: tuple[Kube, str]) -> None:
    kube, ns = source
    name = "imported"
    before = source_sql(kube, ns, FINGERPRINT, "shop")
    kube.kubectl(
        "apply", "-f", "-", input=json.dumps(password_secret(ns, "legacy-reader", READER_PASSWORD, name))
    )
    body = cluster(name, ns, replicas=1, version="17", resources=SMALL,
                   bootstrap=import_bootstrap(ns, "legacy-reader", "shop", jobs=2))  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))

    def succeeded() -> dict[str, Any] | None:
        imported = status(kube, ns, name).get("import") or {}
        assert imported.get("phase") != "Failed", imported
        return imported if imported.get("phase") == "Succeeded" else None

    done = wait_until("the import to succeed", succeeded, 900, 3)
    assert (done["databasesDone"], done["databasesTotal"], done["attempt"]) == (1, 1, 1)
    assert done["objects"] > 0
    wait_serving(kube, ns, name, 1, 300)
    primary = str(status(kube, ns, name)["currentPrimary"])
    assert superuser_sql(kube, ns, primary, FINGERPRINT, "app") == before
    assert superuser_sql(kube, ns, primary, "SELECT nextval('invoice_numbers')", "app") == "1017"
    # The index came over, and every table belongs to the application role.
    index = "SELECT count(*) FROM pg_indexes WHERE indexname = 'orders_by_customer'"
    assert superuser_sql(kube, ns, primary, index, "app") == "1"
    owners_sql = "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'"
    owners = superuser_sql(kube, ns, primary, owners_sql, "app")
    assert owners == "app"

    # The Job is gone once the status recorded the success.
    def no_job() -> bool:
        selector = f"db.example.com/cluster={name}"
        return not get_json(kube, "jobs", "-n", ns, "-l", selector)["items"]

    wait_until("the import Job to be deleted", no_job, 120, 2)
    assert source_sql(kube, ns, FINGERPRINT, "shop") == before


def test_a_wrong_password_fails_the_import_and_the_cluster_stays_not_ready(source: tuple[Kube, str]) -> None:
    kube, ns = source
    name = "refused"
    before = source_sql(kube, ns, FINGERPRINT, "shop")
    kube.kubectl(
        "apply", "-f", "-", input=json.dumps(password_secret(ns, "wrong-reader", "not-the-password", name))
    )
    body = cluster(name, ns, replicas=1, version="17", resources=SMALL,
                   bootstrap=import_bootstrap(ns, "wrong-reader", "shop"))  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))

    def failed() -> dict[str, Any] | None:
        st = status(kube, ns, name)
        return st if (st.get("import") or {}).get("phase") == "Failed" else None

    st = wait_until("the import to fail", failed, 900, 3)
    message = st["import"]["message"]
    assert message.startswith("dump failed") and "password authentication failed" in message
    assert "not-the-password" not in json.dumps(st)
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ImportFailed")
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ImportFailed")
    warnings = [e for e in events_for(kube, ns, name) if e.get("reason") == "ImportFailed"]
    assert warnings and warnings[0]["type"] == "Warning" and "not-the-password" not in warnings[0]["message"]
    assert source_sql(kube, ns, FINGERPRINT, "shop") == before
