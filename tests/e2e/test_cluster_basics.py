"""A real PostgreSQL cluster on the full profile: the operator installed from deploy/ (its image built
locally), the user's example applied, Patroni electing a primary and two streaming replicas, and an
application connecting with the `<name>-app` Secret."""

from __future__ import annotations

import psycopg

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import connect_app, secret, service_ip, status, wait_serving
from harness.waiting import wait_until

NS, NAME = EXAMPLE_NAMESPACE, EXAMPLE


def test_example_becomes_ready_with_one_primary_and_two_streaming_replicas(example: Kube) -> None:
    st = status(example, NS, NAME)
    assert sorted(i["role"] for i in st["instances"]) == ["primary", "replica", "replica"], st
    assert st["readyReplicas"] == 3 and st["currentPrimary"]
    primary_ip = get_json(example, "pod", st["currentPrimary"], "-n", NS)["status"]["podIP"]
    su = secret(example, NS, f"{NAME}-superuser")
    with psycopg.connect(host=primary_ip, port=5432, user=su["username"], password=su["password"],
                         dbname="postgres", connect_timeout=5) as conn:
        states = [r[0] for r in conn.execute("select state from pg_stat_replication").fetchall()]
    assert states == ["streaming", "streaming"], states
    printed = example.kubectl("get", "pgc", "-n", NS).stdout
    assert NAME in printed and st["currentPrimary"] in printed, printed


def test_application_writes_through_rw_and_reads_through_ro(example: Kube) -> None:
    wait_serving(example, NS, NAME, 3, 60)
    with connect_app(example, NS, NAME, "rw") as rw:
        assert rw.execute("select pg_is_in_recovery()").fetchone() == (False,)
        rw.execute("create table if not exists orders (id serial primary key, item text not null)")
        rw.execute("insert into orders (item) select 'item-' || g from generate_series(1, 100) g")
        written = rw.execute("select count(*) from orders").fetchone()

    def replica_has_rows() -> bool:
        with connect_app(example, NS, NAME, "ro") as ro:
            assert ro.execute("select pg_is_in_recovery()").fetchone() == (True,)
            return ro.execute("select count(*) from orders").fetchone() == written

    wait_until("the rows to reach a replica through -ro", replica_has_rows, timeout=60)


def test_app_secret_uri_works_as_given(example: Kube) -> None:
    app = secret(example, NS, f"{NAME}-app")
    # The URI names the Service's DNS name; the host resolves ClusterIPs only, so swap in the IP.
    uri = app["uri"].replace(app["host"], service_ip(example, NS, f"{NAME}-rw"))
    with psycopg.connect(uri, connect_timeout=5) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == (
            app["username"], app["dbname"])
