"""What the extension tests share (docs/extensions.md): a database declared with extensions on a running
cluster, each instance's start time and settings read from the instance itself, a nearest-neighbour
query with pgvector, and the instance's log read for pgaudit's lines."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg

from harness.e2e_backup import superuser_sql
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import secret, service_ip, status
from harness.waiting import wait_until

# The database the tests declare, owned by the cluster's application owner (bootstrap.initdb.owner).
DATABASE = "vectors"
# Untrusted extensions (pgvector, pgaudit, pg_stat_statements) are created by the operator in this schema:
# an application adds it to its search path (docs/roles.md).
EXTENSION_SCHEMA = "extensions"


def patch_spec(kube: Kube, ns: str, cluster: str, spec: dict[str, Any]) -> None:
    kube.kubectl("patch", "pgc", cluster, "-n", ns, "--type=merge", "-p", json.dumps({"spec": spec}))


def pods(kube: Kube, ns: str, cluster: str) -> list[dict[str, Any]]:
    return list(get_json(kube, "pods", "-n", ns, "-l", f"db.example.com/cluster={cluster}")["items"])


def on_each_pod(kube: Kube, ns: str, cluster: str, query: str) -> dict[str, Any]:
    """The query's single value on every instance, as the application owner, connecting to each pod."""
    app = secret(kube, ns, f"{cluster}-app")
    values: dict[str, Any] = {}
    for pod in pods(kube, ns, cluster):
        with psycopg.connect(
            host=pod["status"]["podIP"],
            port=int(app["port"]),
            user=app["username"],
            password=app["password"],
            dbname=app["dbname"],
            connect_timeout=3,
        ) as conn:
            row = conn.execute(query).fetchone()
            values[pod["metadata"]["name"]] = row[0] if row else None
    return values


def preloaded_on_each_pod(kube: Kube, ns: str, cluster: str) -> dict[str, str]:
    """shared_preload_libraries as each instance runs with it. Read as the superuser over the pod's socket:
    PostgreSQL shows the setting only to superusers and pg_read_all_settings."""
    return {
        pod["metadata"]["name"]: superuser_sql(
            kube, ns, pod["metadata"]["name"], "SHOW shared_preload_libraries"
        )
        for pod in pods(kube, ns, cluster)
    }


def start_times(kube: Kube, ns: str, cluster: str) -> dict[str, datetime]:
    return on_each_pod(kube, ns, cluster, "select pg_postmaster_start_time()")


def pending_restart(kube: Kube, ns: str, cluster: str) -> list[str]:
    """The instances Patroni marks as waiting for a restart."""
    waiting = []
    for pod in pods(kube, ns, cluster):
        state = json.loads((pod["metadata"].get("annotations") or {}).get("status") or "{}")
        if state.get("pending_restart"):
            waiting.append(pod["metadata"]["name"])
    return waiting


def database_applied(kube: Kube, ns: str, cluster: str, name: str = DATABASE) -> dict[str, Any] | None:
    for db in status(kube, ns, cluster).get("databases") or ():
        if db.get("name") == name and db.get("applied") is True:
            return dict(db)
    return None


def wait_database(kube: Kube, ns: str, cluster: str, timeout: float) -> dict[str, Any]:
    def last() -> Any:
        return [d for d in status(kube, ns, cluster).get("databases") or () if d.get("name") == DATABASE]

    try:
        return dict(
            wait_until(
                f"{cluster}: database {DATABASE} applied",
                lambda: database_applied(kube, ns, cluster),
                timeout,
                3,
            )
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last: {last()}") from None


def connect_database(kube: Kube, ns: str, cluster: str, dbname: str = DATABASE) -> psycopg.Connection[Any]:
    """The application owner on `dbname` through -rw, the extensions' schema on its search path."""
    app = secret(kube, ns, f"{cluster}-app")
    return psycopg.connect(
        host=service_ip(kube, ns, f"{cluster}-rw"),
        port=int(app["port"]),
        user=app["username"],
        password=app["password"],
        dbname=dbname,
        connect_timeout=5,
        autocommit=True,
        options=f"-c search_path=public,{EXTENSION_SCHEMA}",
    )


def nearest_neighbours(conn: psycopg.Connection[Any]) -> tuple[list[int], list[int]]:
    """Three nearest neighbours of one point among 500, through an IVFFlat and then an HNSW index (index
    scans forced), and the exact answer computed without pgvector's operators."""
    conn.execute("DROP TABLE IF EXISTS items_nn")
    conn.execute("CREATE TABLE items_nn (id int PRIMARY KEY, v vector(3))")
    conn.execute(
        "INSERT INTO items_nn SELECT i, ARRAY[i % 50, (i * 7) % 31, i / 10]::real[]::vector "
        "FROM generate_series(1, 500) i"
    )
    target = "[10, 12, 20]"
    exact = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM items_nn ORDER BY ((v::real[])[1] - 10) ^ 2 + ((v::real[])[2] - 12) ^ 2 "
            "+ ((v::real[])[3] - 20) ^ 2, id LIMIT 3"
        ).fetchall()
    ]
    found: list[int] = []
    conn.execute("SET enable_seqscan = off")
    for method in ("ivfflat (v vector_l2_ops) WITH (lists = 1)", "hnsw (v vector_l2_ops)"):
        conn.execute("DROP INDEX IF EXISTS items_nn_v")
        conn.execute(f"CREATE INDEX items_nn_v ON items_nn USING {method}")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT id FROM items_nn ORDER BY v <-> %s::vector LIMIT 3", (target,)
            ).fetchall()
        )
        assert "items_nn_v" in plan, plan
        found = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM items_nn ORDER BY v <-> %s::vector, id LIMIT 3", (target,)
            ).fetchall()
        ]
        assert found == exact, (method, found, exact)
    return found, exact


def instance_log(kube: Kube, ns: str, pod: str, since: str = "10m") -> str:
    """PostgreSQL's log of one instance (its stderr, the container's log)."""
    return str(kube.kubectl("logs", pod, "-n", ns, "-c", "postgres", f"--since={since}").stdout)
