"""Rolling minor upgrade 16.13 → 16.15 under a continuous writer, and scaling 3 → 5 → 2 that never
removes the primary, on real pods."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import Writer, connect_app, healthy, serving_cluster
from harness.waiting import wait_until
from pg_operator.images import image_for

NS, NAME = "rollout", "upgrade-db"
OLD, NEW = image_for("16.13"), image_for("16.15")


@pytest.fixture(scope="module")
def cluster(operator: Kube) -> Iterator[Kube]:
    yield from serving_cluster(operator, NS, NAME, {"replicas": 3, "image": OLD})


def pod_images(kube: Kube) -> dict[str, str]:
    pods = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={NAME}")["items"]
    return {p["metadata"]["name"]: p["spec"]["containers"][0]["image"] for p in pods}


def test_rolling_minor_upgrade_keeps_writes_and_ends_on_the_new_version(cluster: Kube) -> None:
    with connect_app(cluster, NS, NAME) as conn:
        assert str(conn.execute("show server_version").fetchone()[0]).startswith("16.13")
    with Writer(cluster, NS, NAME, "upgrade_writes") as writer:
        writer.wait_for_writes(20, 60)
        new_image = json.dumps({"spec": {"image": NEW}})
        cluster.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", new_image)

        def upgraded() -> bool:
            images = pod_images(cluster)
            return len(images) == 3 and set(images.values()) == {NEW} and bool(healthy(cluster, NS, NAME, 3))

        wait_until("every instance on 16.15 and healthy", upgraded, 900, 2)
        writer.wait_for_writes(20, 60)
    print(
        json.dumps(
            {
                "measure": "rolling_upgrade",
                "outages": len(writer.outages),
                "total_write_outage_s": round(sum(writer.outages), 2),
                "longest_write_outage_s": round(writer.longest_outage, 2),
            }
        ),
        flush=True,
    )
    assert writer.missing() == []
    with connect_app(cluster, NS, NAME) as conn:
        assert str(conn.execute("show server_version").fetchone()[0]).startswith("16.15")


def test_scale_up_then_down_never_removes_the_primary(cluster: Kube) -> None:
    cluster.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", '{"spec": {"replicas": 5}}')
    st = wait_until("5 healthy instances", lambda: healthy(cluster, NS, NAME, 5), 900, 2)
    # Put the primary on the highest ordinal, so scaling down to 2 must move it first.
    request = f"db.example.com/switchover-to={NAME}-4"
    cluster.kubectl("annotate", "pgc", NAME, "-n", NS, request, "--overwrite")
    wait_until(
        "the primary on ordinal 4",
        lambda: (healthy(cluster, NS, NAME, 5) or {}).get("currentPrimary") == f"{NAME}-4",
        180,
        1,
    )
    with Writer(cluster, NS, NAME, "scale_writes") as writer:
        writer.wait_for_writes(10, 60)
        cluster.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
        st = wait_until("2 healthy instances", lambda: healthy(cluster, NS, NAME, 2), 600, 2)
        writer.wait_for_writes(10, 60)
    assert st["currentPrimary"] in (f"{NAME}-0", f"{NAME}-1")
    # Parallel pod management: ordinals 2-4 are deleted together and each shuts PostgreSQL down cleanly
    # in its own time, so a removed pod may still be terminating when the status already counts two.
    left = [f"{NAME}-0", f"{NAME}-1"]
    wait_until("only ordinals 0 and 1 left", lambda: sorted(pod_images(cluster)) == left, 120, 1)
    assert writer.missing() == []
