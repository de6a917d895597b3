"""Every PostgreSQL major the images ship (15 to 18) on real pods (16, every other module's major, is
proven by them: test_backup, test_cluster_failover, test_cluster_basics), sharing one kube cluster and one
S3 store: one small two-instance cluster per major, all created at once so their start-ups overlap, then
for each major: connect and write on that exact major, a base backup, a point-in-time restore (again one
restored cluster per major, created together) that holds exactly the rows written before the target time
and runs the same major, and a failover with writes through `-rw` from the new primary.
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
from harness.kube import apply_objects
from harness.local_cluster import Kube
from harness.objects import backup
from harness.pgcluster import connect_app, status, wait_serving
from harness.waiting import wait_until
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
