"""The pooler on real pods (docs/pooler.md), on the session's example cluster (orders-db in shop): turned
on with a generated role, an application connecting through `-pooler-rw` with `sslmode=verify-full` from
the Secrets' `pgbouncer-uri`, writers of many short transactions through the pooler (a new connection
per transaction, and one persistent connection) beside a direct `-rw` writer across a requested
switchover — none of the pooler's transactions may fail — then the primary's container killed and
recovered through the pooler, the pooler's and the operator's metrics; the pooler turned off again and
the cluster left serving as it was found. bench/bench_pooler.py measures the same over trials."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from harness.deployed_operator import EXAMPLE, EXAMPLE_NAMESPACE
from harness.e2e_backup import superuser_sql
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import kill_container, secret, service_ip, status, wait_serving
from harness.pooler_drivers import DriverWriter, missing_rows
from harness.pooler_load import TxWriter, endpoint
from harness.waiting import wait_until

pytestmark = pytest.mark.e2e

NS, NAME = EXAMPLE_NAMESPACE, EXAMPLE
ROLE = "pooled_app"
ROLE_SECRET = f"{NAME}-pooled-app"  # <cluster>-<role, '_' as '-'>
POOLER = {"instances": 2, "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}}}
SWITCHOVER = "db.example.com/switchover-to"


def patch(kube: Kube, body: object) -> None:
    kube.kubectl("-n", NS, "patch", "pgc", NAME, "--type=merge", "-p", json.dumps(body))


def pooler_condition(kube: Kube) -> dict[str, str]:
    return next((c for c in status(kube, NS, NAME).get("conditions") or () if c["type"] == "Pooler"), {})


def pooler_ready(kube: Kube) -> dict[str, str] | None:
    cond = pooler_condition(kube)
    return cond if cond.get("status") == "True" else None


def pointing_at(kube: Kube, primary: str) -> bool:
    cond = pooler_ready(kube)
    return cond is not None and f"{primary}.{NAME}.{NS}.svc" in cond.get("message", "")


def pooler_pods(kube: Kube) -> list[dict[str, object]]:
    items = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/pooler={NAME}")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture(scope="module")
def pooled(example: Kube) -> Iterator[Kube]:
    wait_serving(example, NS, NAME, 3, 300)
    patch(example, {"spec": {"pooler": POOLER, "roles": [{"name": ROLE, "login": True}],
                             "removalPolicy": {"roles": "delete"}}})  # fmt: skip
    try:
        wait_until("the pooler ready and pointed at the primary", lambda: pooler_ready(example), 180, 1)
        yield example
    finally:
        patch(example, {"spec": {"pooler": None, "roles": None}})
        wait_until("the pooler's pods gone", lambda: not pooler_pods(example), 120, 1)
        wait_until(
            f"Secret {ROLE_SECRET} gone",
            lambda: example.kubectl("-n", NS, "get", "secret", ROLE_SECRET, check=False).returncode != 0,
            120,
            1,
        )
        patch(example, {"spec": {"removalPolicy": None}})
        wait_serving(example, NS, NAME, 3, 300)
        wait_until(
            "the pooler's keys gone from the app Secret",
            lambda: not any(k.startswith("pgbouncer") for k in secret(example, NS, f"{NAME}-app")),
            60,
            1,
        )

        # Nothing of the pooler outlives it in the database: no role to log in as, no lookup left in
        # template1 for the next database to inherit.
        def left_behind() -> str:
            primary = str(status(example, NS, NAME)["currentPrimary"])
            roles = superuser_sql(example, NS, primary,
                                  "SELECT count(*) FROM pg_roles WHERE rolname = 'pgop_pooler'")  # fmt: skip
            schemas = superuser_sql(example, NS, primary,
                                    "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgop_pooler'",
                                    database="template1")  # fmt: skip
            return f"{roles}/{schemas}"

        wait_until("the pooler's role and lookup gone", lambda: left_behind() == "0/0", 60, 2)


def connect_from_secret(kube: Kube, secret_name: str) -> psycopg.Connection[object]:
    """What an application does with the Secret: its pgbouncer-uri as it stands, verify-full against its
    ca.crt (the test runs outside the cluster: the Service's name is resolved by hand)."""
    values = secret(kube, NS, secret_name)
    params = conninfo_to_dict(values["pgbouncer-uri"])
    assert params["sslmode"] == "verify-full" and params["host"] == values["pgbouncer-host"]
    ep = endpoint(kube, NS, NAME, f"{NAME}-pooler-rw", secret_name)
    return psycopg.connect(values["pgbouncer-uri"], hostaddr=service_ip(kube, NS, f"{NAME}-pooler-rw"),
                           sslrootcert=ep.ca_file, connect_timeout=10, autocommit=True)  # fmt: skip


def test_applications_connect_through_the_pooler_with_the_secrets_uris(pooled: Kube) -> None:
    primary = status(pooled, NS, NAME)["currentPrimary"]
    assert pointing_at(pooled, primary)
    app = secret(pooled, NS, f"{NAME}-app")
    assert app["pgbouncer-host"] == f"{NAME}-pooler-rw.{NS}.svc" and app["pgbouncer-port"] == "5432"
    assert app["pgbouncer-jdbc-uri"].startswith(f"jdbc:postgresql://{NAME}-pooler-rw.{NS}.svc:5432/")
    assert "sslmode=verify-full" in app["pgbouncer-jdbc-uri"]
    with connect_from_secret(pooled, f"{NAME}-app") as conn:
        row = conn.execute(
            "select current_user, pg_is_in_recovery(), "
            "(select ssl from pg_stat_ssl where pid = pg_backend_pid())"
        ).fetchone()
        assert row == (app["username"], False, True)  # the primary, and TLS on the pooler's server side too
    role_secret = ROLE_SECRET
    wait_until(f"{role_secret} with the pooler's keys",
               lambda: "pgbouncer-uri" in secret(pooled, NS, role_secret), 60, 1)  # fmt: skip
    with connect_from_secret(pooled, role_secret) as conn:
        assert conn.execute("select current_user").fetchone() == (ROLE,)
    # The auth query never hands out a superuser's verifier.
    su = secret(pooled, NS, f"{NAME}-superuser")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host=f"{NAME}-pooler-rw.{NS}.svc",
                        hostaddr=service_ip(pooled, NS, f"{NAME}-pooler-rw"),
                        user=su["username"], password=su["password"], dbname="postgres", sslmode="require",
                        connect_timeout=10).close()  # fmt: skip


def test_no_transaction_through_the_pooler_fails_across_a_requested_switchover(pooled: Kube) -> None:
    old = status(pooled, NS, NAME)["currentPrimary"]
    pooler = endpoint(pooled, NS, NAME, f"{NAME}-pooler-rw")
    direct = endpoint(pooled, NS, NAME, f"{NAME}-rw")
    writers = {
        "pooler_new_connection": TxWriter(pooler, "pooler_so_a", persistent=False),
        "pooler_persistent": TxWriter(pooler, "pooler_so_b", persistent=True),
        "direct_new_connection": TxWriter(direct, "pooler_so_c", persistent=False),
    }
    for w in writers.values():
        w.start()
    try:
        for w in writers.values():
            assert w.wait_for(20, 60), f"no steady writes: {w.summary()}"
            w.reset()
        pooled.kubectl("-n", NS, "annotate", "pgc", NAME, f"{SWITCHOVER}=auto", "--overwrite")
        new = wait_until("a new primary", lambda: (st := status(pooled, NS, NAME)).get("currentPrimary")
                         not in (None, "", old) and st["currentPrimary"], 120, 0.5)  # fmt: skip
        wait_until("the pooler pointed at the new primary", lambda: pointing_at(pooled, new), 60, 0.5)
        for w in writers.values():
            assert w.wait_for(20, 60), f"writes did not resume: {w.summary()}"
    finally:
        for w in writers.values():
            w.stop()
    figures = {k: w.summary() for k, w in writers.items()}
    print(json.dumps({"measure": "pooler_switchover", "old": old, "new": new, **figures}), flush=True)
    assert writers["pooler_new_connection"].failures == 0, figures
    assert writers["pooler_persistent"].failures == 0, figures


def prepared_statement_counters(kube: Kube) -> dict[str, float]:
    """PgBouncer's protocol-level prepared statement counters, summed over the `-pooler-rw` pods."""
    out = {"pgbouncer_stats_client_parses_total": 0.0, "pgbouncer_stats_server_parses_total": 0.0}
    for pod in pooler_pods(kube):
        if pod["metadata"]["labels"].get("db.example.com/pooler-side") != "rw":  # type: ignore[index]
            continue
        for line in scrape_pooler(kube, str(pod["status"]["podIP"])).splitlines():  # type: ignore[index]
            name = line.split("{", 1)[0]
            if name in out:
                out[name] += float(line.rsplit(" ", 1)[1])
    return out


def requested_switchover(kube: Kube) -> tuple[str, str]:
    """Asks for a switchover from a serving cluster and waits until the pooler points at the new primary."""
    old = wait_serving(kube, NS, NAME, 3, 300)["currentPrimary"]
    wait_until("the pooler pointed at the primary", lambda: pointing_at(kube, old), 60, 0.5)
    kube.kubectl("-n", NS, "annotate", "pgc", NAME, f"{SWITCHOVER}=auto", "--overwrite")
    new = wait_until("a new primary", lambda: (st := status(kube, NS, NAME)).get("currentPrimary")
                     not in (None, "", old) and st["currentPrimary"], 120, 0.5)  # fmt: skip
    wait_until("the pooler pointed at the new primary", lambda: pointing_at(kube, new), 60, 0.5)
    return old, new


def test_drivers_at_their_defaults_lose_nothing_across_requested_switchovers(pooled: Kube) -> None:
    """psycopg 3 and asyncpg, neither told to stop preparing statements, through `-pooler-rw` across
    two requested switchovers: no transaction fails, every acknowledged row is on the new primary, and
    PgBouncer prepared the drivers' statements again on the new primary's server connections."""
    pooler = endpoint(pooled, NS, NAME, f"{NAME}-pooler-rw")
    writers = [DriverWriter(driver, pooler, f"pooler_drv_{driver}_{i}")
               for driver in ("psycopg", "asyncpg") for i in range(2)]  # fmt: skip
    for w in writers:
        w.start()
    switchovers: list[tuple[str, str]] = []
    try:
        for w in writers:  # past psycopg's threshold of 5: its statement is prepared from here on
            assert w.wait_for(20, 60), f"no steady writes: {w.summary()}"
            w.reset()
        before = prepared_statement_counters(pooled)
        for _ in range(2):
            switchovers.append(requested_switchover(pooled))
            for w in writers:
                assert w.wait_for(20, 60), f"writes did not resume: {w.summary()}"
        after = prepared_statement_counters(pooled)
    finally:
        for w in writers:
            w.stop()
    figures = [w.summary() for w in writers]
    print(json.dumps({"measure": "pooler_drivers_switchover", "switchovers": switchovers,
                      "writers": figures, "before": before, "after": after}), flush=True)  # fmt: skip
    assert all(w.failures == 0 for w in writers), figures
    direct = endpoint(pooled, NS, NAME, f"{NAME}-rw")
    lost = {w.table: missing_rows(direct, w.table, w.acked) for w in writers}
    assert not any(lost.values()), lost
    # The drivers really sent protocol-level prepared statements, and PgBouncer prepared them anew on
    # the new primaries' server connections (parses reaching the servers after the switchovers).
    assert after["pgbouncer_stats_client_parses_total"] > 0, after
    assert after["pgbouncer_stats_server_parses_total"] > before["pgbouncer_stats_server_parses_total"], (
        before, after)  # fmt: skip


def test_a_killed_primary_is_recovered_through_the_pooler(pooled: Kube) -> None:
    old = wait_serving(pooled, NS, NAME, 3, 300)["currentPrimary"]
    wait_until("the pooler pointed at the primary", lambda: pointing_at(pooled, old), 60, 0.5)
    writer = TxWriter(endpoint(pooled, NS, NAME, f"{NAME}-pooler-rw"), "pooler_kill", persistent=True).start()
    try:
        assert writer.wait_for(20, 60), writer.summary()
        writer.reset()
        killed = time.monotonic()
        kill_container(pooled, NS, old)
        new = wait_until("a new primary", lambda: (st := status(pooled, NS, NAME)).get("currentPrimary")
                         not in (None, "", old) and st["currentPrimary"], 120, 0.5)  # fmt: skip
        wait_until("the pooler pointed at the new primary", lambda: pointing_at(pooled, new), 60, 0.5)
        assert writer.wait_for(20, 90), f"writes through the pooler did not resume: {writer.summary()}"
        recovered = time.monotonic() - killed
    finally:
        writer.stop()
    print(json.dumps({"measure": "pooler_primary_kill", "old": old, "new": new,
                      "recovered_after_s": round(recovered, 1), **writer.summary()}), flush=True)  # fmt: skip
    wait_serving(pooled, NS, NAME, 3, 300)


def scrape(ip: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def scrape_pooler(kube: Kube, ip: str) -> str:
    """The pooler pod's metrics over HTTPS, verified against the cluster's CA under the pooler Service's
    name (the pod IP is not in the certificate); plain HTTP gets no answer."""
    ca = secret(kube, NS, f"{NAME}-app")["ca.crt"]
    context = ssl.create_default_context(cadata=ca)
    with socket.create_connection((ip, 9127), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=f"{NAME}-pooler-rw.{NS}.svc") as tls:  # fmt: skip
        tls.sendall(b"GET /metrics HTTP/1.0\r\nHost: pooler\r\n\r\n")
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200"), head[:100]
    return body.decode()


def test_metrics_of_the_pooler_pods_and_the_operator(pooled: Kube) -> None:
    for pod in pooler_pods(pooled):
        ip = str(pod["status"]["podIP"])  # type: ignore[index]
        with pytest.raises((OSError, http.client.HTTPException)):
            scrape(ip, 9127)  # TLS only
        text = scrape_pooler(pooled, ip)
        assert "pgbouncer_up 1" in text
        assert "pgbouncer_pools_client_active_connections{" in text
        assert "pgbouncer_stats_sql_transactions_pooled_total{" in text
        assert "pg_operator_pooler_paused 0" in text
    operator_pods = get_json(pooled, "pods", "-n", "pg-operator-system",
                             "-l", "app.kubernetes.io/name=pg-operator")["items"]  # fmt: skip
    texts = [scrape(p["status"]["podIP"], 8081) for p in operator_pods if p["status"].get("podIP")]
    pauses = [
        line
        for t in texts
        for line in t.splitlines()
        if line.startswith("pg_operator_pooler_pauses_total{") and f'cluster="{NAME}"' in line
    ]
    assert pauses and max(float(line.rsplit(" ", 1)[1]) for line in pauses) >= 1, pauses
