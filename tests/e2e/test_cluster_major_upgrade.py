"""In-place major upgrade on real pods (16 → 17), in one two-instance cluster:

- a `regproc` column makes the live `pg_upgrade --check` fail: a Warning Event quotes pg_upgrade's
  reason, the cluster keeps serving 16 and its pods are the same;
- with the column gone (and the upgrade's annotation removed to retry at once), the upgrade runs under a
  writer on a persistent connection: every acknowledged row is on the new major (rows lost: 0), the
  primary serves 17.11, the replica is back, Events name each phase and the write outage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from localkube.images.containerd import ensure_images

from harness.kube import events_for, get_json
from harness.local_cluster import Kube
from harness.pgcluster import Writer, connect_app, serving_cluster, status
from harness.waiting import wait_until
from pg_operator.images import BUILT_VERSIONS, default_image

NS, NAME = "major-upgrade", "upg-db"
ANNOTATION = "db.example.com/major-upgrade"


@pytest.fixture(scope="module")
def cluster(operator: Kube) -> Iterator[Kube]:
    ensure_images(operator.ctx, [default_image("16"), default_image("17")])
    yield from serving_cluster(operator, NS, NAME, {"replicas": 2, "version": "16"})


def upgrade_state(kube: Kube) -> dict[str, Any]:
    raw = (get_json(kube, "pgc", NAME, "-n", NS)["metadata"].get("annotations") or {}).get(ANNOTATION)
    return dict(json.loads(raw)) if raw else {}


def reasons(kube: Kube) -> dict[str, str]:
    return {e.get("reason", ""): e.get("message", "") for e in events_for(kube, NS, NAME)}


def pod_uids(kube: Kube) -> dict[str, str]:
    pods = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={NAME}")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def server_version(kube: Kube) -> str:
    with connect_app(kube, NS, NAME) as conn:
        return str(conn.execute("show server_version").fetchone()[0])


def test_a_failing_check_refuses_the_upgrade_and_the_cluster_keeps_serving(cluster: Kube) -> None:
    with connect_app(cluster, NS, NAME) as conn:
        conn.execute("CREATE TABLE lookups (r regproc)")
        conn.execute("INSERT INTO lookups VALUES ('now')")
    before = pod_uids(cluster)
    cluster.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", '{"spec":{"version":"17"}}')
    wait_until("the check to fail", lambda: upgrade_state(cluster).get("phase") == "CheckFailed", 600, 3)
    message = wait_until("the Warning Event", lambda: reasons(cluster).get("MajorUpgradeCheckFailed"), 60, 2)
    assert "reg*" in message and "still serving 16" in message, message
    assert server_version(cluster) == BUILT_VERSIONS["16"][0]
    assert pod_uids(cluster) == before  # nothing was restarted
    with connect_app(cluster, NS, NAME) as conn:
        conn.execute("INSERT INTO lookups VALUES ('now')")  # still takes writes


def test_the_upgrade_keeps_every_acknowledged_write(cluster: Kube) -> None:
    with connect_app(cluster, NS, NAME) as conn:
        conn.execute("DROP TABLE lookups")
    with Writer(cluster, NS, NAME, "upgrade_writes", persistent=True) as writer:
        writer.wait_for_writes(20, 60)
        # Retry at once instead of waiting for the next periodic check.
        cluster.kubectl("annotate", "pgc", NAME, "-n", NS, f"{ANNOTATION}-")
        wait_until("the upgrade to finish", lambda: upgrade_state(cluster).get("phase") == "Done", 1500, 3)
        writer.wait_for_writes(20, 120)
    state = upgrade_state(cluster)
    lost = writer.missing()
    figures = {
        "measure": "major_upgrade_16_17",
        "write_outage_s": round(writer.longest_outage, 2),
        "operator_outage_s": state.get("outage"),
        "acknowledged": len(writer.acked),
        "rows_lost": len(lost),
        "replicas_back_s": round(state["replicasBack"] - state["writable"], 1),
    }
    print(json.dumps(figures), flush=True)
    assert lost == []
    assert server_version(cluster) == BUILT_VERSIONS["17"][0]
    found = reasons(cluster)
    for reason in ("MajorUpgradeCheckPassed", "MajorUpgradeStarting", "MajorUpgradePrimaryWritable",
                   "MajorUpgradeReplicasBack", "MajorUpgradeCompleted"):  # fmt: skip
        assert reason in found, sorted(found)
    assert "write outage" in found["MajorUpgradeCompleted"]
    st = status(cluster, NS, NAME)
    assert sorted(i["role"] for i in st["instances"]) == ["primary", "replica"]
    assert all(i["ready"] for i in st["instances"])
