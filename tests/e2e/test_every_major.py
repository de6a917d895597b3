"""Every PostgreSQL major the images ship (15 to 18) on real pods (16, every other module's major, is
proven by them: test_backup, test_cluster_failover, test_cluster_basics), sharing one kube cluster and one
S3 store: one small two-instance cluster per major, all created at once so their start-ups overlap, then
for each major: connect and write on that exact major, a base backup, a point-in-time restore (again one
restored cluster per major, created together) that holds exactly the rows written before the target time
and runs the same major, and a failover with writes through `-rw` from the new primary. Then the
extensions: preloaded libraries declared on the running clusters (a rolling restart), pg_stat_statements
collecting, a pgvector nearest-neighbour query and, where the image has pgaudit, its audit line for DDL.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from localkube.images.containerd import ensure_images

from harness.e2e_backup import (
    Moto,
    archived_after_switch,
    backup_cluster,
    credentials,
    rows,
    s3,
    wait_backup,
    wait_condition,
)
from harness.extensions import (
    DATABASE,
    connect_database,
    instance_log,
    nearest_neighbours,
    patch_spec,
    pending_restart,
    preloaded_on_each_pod,
    start_times,
    wait_database,
)
from harness.kube import apply_objects
from harness.local_cluster import Kube
from harness.objects import backup
from harness.pgcluster import connect_app, secret, status, wait_serving
from harness.waiting import wait_until
from pg_operator.api.parameters import MISSING_LIBRARIES
from pg_operator.images import BUILT_VERSIONS, SUPPORTED_MAJORS, default_image

DEFAULT_MAJOR = "16"  # examples/orders-db.yaml's and harness.objects.cluster()'s

# The default major (the example cluster's, and every other e2e module's) is proven there: create,
# connect, fail over, back up and restore. Here the others, which nothing else runs.
MAJORS = [m for m in SUPPORTED_MAJORS if m != DEFAULT_MAJOR]


def name(major: str) -> str:
    return f"pg{major}-db"


def restored(major: str) -> str:
    return f"pg{major}-pitr"


@pytest.fixture(scope="module")
def clusters(operator: Kube, ns: str, moto: Moto) -> dict[str, str]:
    """One archiving two-instance cluster per major, applied together; each serving."""
    ensure_images(operator.ctx, [default_image(m) for m in MAJORS])

    def store(cluster_name: str) -> dict[str, Any]:
        return {"s3": s3(moto, cluster_name), "archiveTimeout": "10s", "onDelete": "delete"}

    apply_objects(
        operator,
        *[credentials(moto, ns, name(m)) for m in MAJORS],
        *[backup_cluster(name(m), ns, 2, version=m, backup=store(name(m))) for m in MAJORS],
    )
    for m in MAJORS:
        wait_serving(operator, ns, name(m), 2, 900)
    return {m: name(m) for m in MAJORS}


@pytest.mark.parametrize("major", MAJORS)
def test_runs_the_major_it_asks_for(operator: Kube, ns: str, clusters: dict[str, str], major: str) -> None:
    with connect_app(operator, ns, clusters[major]) as conn:
        version = str(conn.execute("show server_version").fetchone()[0])
        conn.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(1, 100)")
    assert version == BUILT_VERSIONS[major][0], version
    wait_condition(operator, ns, clusters[major], "ContinuousArchiving", "True", "Archiving", 240)


@pytest.mark.parametrize("major", MAJORS)
def test_base_backup(operator: Kube, ns: str, clusters: dict[str, str], major: str) -> None:
    apply_objects(operator, backup(f"{clusters[major]}-base", ns, clusters[major]))
    st = wait_backup(operator, ns, f"{clusters[major]}-base", 600)
    assert st["phase"] == "Completed", st


@pytest.fixture(scope="module")
def targets(operator: Kube, ns: str, clusters: dict[str, str]) -> dict[str, str]:
    """Per major: rows 101..200 committed after the target time T (rows 1..100 before it), archived."""
    out: dict[str, str] = {}
    for m in MAJORS:
        with connect_app(operator, ns, clusters[m]) as conn:
            time.sleep(1.5)
            (target,) = conn.execute("SELECT now()").fetchone()
            time.sleep(1.5)
            conn.execute("INSERT INTO items SELECT generate_series(101, 200)")
        out[m] = target.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for m in MAJORS:
        archived_after_switch(operator, ns, clusters[m], 240)
    return out


@pytest.fixture(scope="module")
def restores(operator: Kube, ns: str, moto: Moto, clusters: dict[str, str], targets: dict[str, str]) -> None:
    """One single-instance point-in-time restore per major, applied together."""
    bodies: list[dict[str, Any]] = []
    for m in MAJORS:
        source = {"clusterName": clusters[m], "s3": s3(moto, restored(m))}
        recovery = {"recovery": {"source": source, "targetTime": targets[m]}}
        bodies += [
            credentials(moto, ns, restored(m)),
            backup_cluster(restored(m), ns, 1, version=m, bootstrap=recovery),
        ]
    apply_objects(operator, *bodies)
    for m in MAJORS:
        wait_serving(operator, ns, restored(m), 1, 900)


@pytest.mark.parametrize("major", MAJORS)
def test_point_in_time_restore(operator: Kube, ns: str, restores: None, major: str) -> None:
    assert rows(operator, ns, restored(major)) == list(range(1, 101))
    with connect_app(operator, ns, restored(major)) as conn:
        version = str(conn.execute("show server_version").fetchone()[0])
    assert version == BUILT_VERSIONS[major][0], version


@pytest.mark.parametrize("major", MAJORS)
def test_failover_keeps_serving_writes(
    operator: Kube, ns: str, clusters: dict[str, str], targets: dict[str, str], major: str
) -> None:
    cluster = clusters[major]
    old = status(operator, ns, cluster)["currentPrimary"]
    operator.kubectl("delete", "pod", old, "-n", ns, "--wait=false")

    def moved() -> bool:
        return status(operator, ns, cluster).get("currentPrimary") not in (None, old)

    wait_until(f"{cluster}: a new primary", moved, 180, 2)
    wait_serving(operator, ns, cluster, 2, 600)

    def write() -> bool:
        with connect_app(operator, ns, cluster) as conn:  # -rw may still route to the old one a moment
            conn.execute("INSERT INTO items SELECT generate_series(201, 210)")
        return True

    wait_until(f"{cluster}: a write through -rw to the new primary", write, 120, 2)
    assert rows(operator, ns, cluster) == list(range(1, 211))


# --- extensions (docs/extensions.md) --------------------------------------------------------------------
# On the same clusters, after the tests above: shared_preload_libraries declared on the running clusters
# (a restart-only setting, rolled as any other), a database created with pgvector, pg_stat_statements
# and, where the major's image has it, pgaudit; then each library at work.


def has_pgaudit(major: str) -> bool:
    return major not in MISSING_LIBRARIES["pgaudit"]


def preloaded(major: str) -> str:
    return "pg_stat_statements,auto_explain" + (",pgaudit" if has_pgaudit(major) else "")


@pytest.fixture(scope="module")
def extensions(operator: Kube, ns: str, clusters: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per major: every instance's start time before the libraries were declared. The libraries first,
    on every cluster at once (the rolling restarts overlap), each cluster waiting until every instance
    preloads the list and none waits for a restart; then the database with its extensions (pgaudit's
    CREATE EXTENSION needs the library loaded, and a retry that fails meanwhile is WAL the restarted
    replicas must replay)."""
    before: dict[str, dict[str, Any]] = {}
    for m in MAJORS:
        wait_serving(operator, ns, clusters[m], 2, 300)
        before[m] = start_times(operator, ns, clusters[m])
        audit = {"pgaudit.log": "ddl", "pgaudit.log_relation": "on"} if has_pgaudit(m) else {}
        parameters = {"shared_preload_libraries": preloaded(m), **audit}
        patch_spec(operator, ns, clusters[m], {"postgresql": {"parameters": parameters}})
    for m in MAJORS:
        cluster = clusters[m]

        def applied(m: str = m, cluster: str = cluster) -> bool:
            libraries = preloaded_on_each_pod(operator, ns, cluster)
            return (
                len(libraries) == 2
                and set(libraries.values()) == {preloaded(m)}
                and not pending_restart(operator, ns, cluster)
            )

        wait_until(f"{cluster}: {preloaded(m)} preloaded on every instance", applied, 900, 3)
    for m in MAJORS:
        extensions = ["vector", "pg_stat_statements", *(["pgaudit"] if has_pgaudit(m) else [])]
        owner = secret(operator, ns, f"{clusters[m]}-app")["username"]  # the application owner
        patch_spec(operator, ns, clusters[m],
                   {"databases": [{"name": DATABASE, "owner": owner, "extensions": extensions}]})  # fmt: skip
    for m in MAJORS:
        wait_serving(operator, ns, clusters[m], 2, 600)
        wait_database(operator, ns, clusters[m], 300)
    return before


@pytest.mark.parametrize("major", MAJORS)
def test_a_declared_preload_restarts_every_instance_and_pg_stat_statements_collects(
    operator: Kube, ns: str, clusters: dict[str, str], extensions: dict[str, dict[str, Any]], major: str
) -> None:
    after = start_times(operator, ns, clusters[major])
    assert set(after) == set(extensions[major]), (after, extensions[major])
    assert all(after[pod] > extensions[major][pod] for pod in after), "an instance was not restarted"
    with connect_database(operator, ns, clusters[major]) as conn:
        # An alias survives pg_stat_statements' normalisation (a literal would be recorded as $1).
        conn.execute("SELECT count(*) AS statements_marker FROM pg_class")
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE query LIKE %s AND query NOT LIKE %s",
            ("%statements_marker%", "%pg_stat_statements%"),
        ).fetchone()
    assert row is not None and row[0] >= 1, f"pg_stat_statements did not record the statement: {row}"


@pytest.mark.parametrize("major", MAJORS)
def test_vector_answers_a_nearest_neighbour_query(
    operator: Kube, ns: str, clusters: dict[str, str], extensions: dict[str, dict[str, Any]], major: str
) -> None:
    with connect_database(operator, ns, clusters[major]) as conn:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        found, exact = nearest_neighbours(conn)
    assert row == ("0.8.0",), row
    assert found == exact and len(found) == 3


@pytest.mark.parametrize("major", [m for m in MAJORS if has_pgaudit(m)])
def test_pgaudit_writes_an_audit_line_for_ddl(
    operator: Kube, ns: str, clusters: dict[str, str], extensions: dict[str, dict[str, Any]], major: str
) -> None:
    table = f"audited_{major}_{int(time.time())}"
    with connect_database(operator, ns, clusters[major]) as conn:
        conn.execute(f"CREATE TABLE {table} (id int)")
    primary = str(status(operator, ns, clusters[major])["currentPrimary"])

    def audited() -> str | None:
        lines = [
            line for line in instance_log(operator, ns, primary).splitlines() if "AUDIT: SESSION" in line
        ]
        return next((line for line in lines if f"CREATE TABLE {table}" in line), None)

    line = wait_until(f"{primary}: an audit line for CREATE TABLE {table}", audited, 60, 2)
    assert ",DDL,CREATE TABLE," in line, line
