"""In-place major upgrade on real pods (16 → 17), in one two-instance cluster with `spec.backup` (the
module's moto store):

- a `regproc` column makes the live `pg_upgrade --check` fail: a Warning Event quotes pg_upgrade's
  reason, the cluster keeps serving 16 and its pods are the same;
- with the column gone (and the upgrade's annotation removed to retry at once), the upgrade runs under a
  writer on a persistent connection: every acknowledged row is on the new major (rows lost: 0), the
  primary serves 17.11, the replica is back on its own data files (it was at the primary's shutdown
  checkpoint, so it is not re-cloned), Events name each phase and the write outage;
- backups across it: PostgreSQL 17 archives to a generation of its own (`<name>-pg17`) and gets a base
  backup the operator asks for; the generations file is in the store; a restore to a time before the
  upgrade runs 16 with exactly the rows before that time, a restore to the latest point runs 17 with
  every acknowledged row, and a restore to the old time asking for 17 is refused.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from localkube.images.containerd import ensure_images

from harness.e2e_backup import (
    Moto,
    archived_after_switch,
    backup_cluster,
    credentials,
    s3,
    wait_backup,
    wait_condition,
)
from harness.kube import apply_objects, events_for, get_json
from harness.local_cluster import Kube
from harness.objects import backup
from harness.pgcluster import Writer, connect_app, status, wait_serving
from harness.waiting import wait_until
from pg_operator.backup import generations
from pg_operator.images import BUILT_VERSIONS, default_image

NAME = "upg-db"
ANNOTATION = "db.example.com/major-upgrade"
NS = ""  # the module's namespace (the `ns` fixture's), set by `cluster`


@pytest.fixture(scope="module")
def cluster(operator: Kube, ns: str, moto: Moto) -> Kube:
    global NS
    NS = ns
    ensure_images(operator.ctx, [default_image("16"), default_image("17")])
    store = {"s3": s3(moto, NAME), "archiveTimeout": "10s", "onDelete": "delete"}
    apply_objects(operator, credentials(moto, ns, NAME),
                  backup_cluster(NAME, ns, 2, version="16", backup=store))  # fmt: skip
    wait_serving(operator, ns, NAME, 2, 900)
    return operator


def upgrade_state(kube: Kube) -> dict[str, Any]:
    raw = (get_json(kube, "pgc", NAME, "-n", NS)["metadata"].get("annotations") or {}).get(ANNOTATION)
    return dict(json.loads(raw)) if raw else {}


def reasons(kube: Kube) -> dict[str, str]:
    return {e.get("reason", ""): e.get("message", "") for e in events_for(kube, NS, NAME)}


def pod_uids(kube: Kube) -> dict[str, str]:
    pods = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={NAME}")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def inode(kube: Kube, pod: str, relpath: str) -> str:
    """The inode number of a file under the pod's PGDATA ("" while it does not exist)."""
    res = kube.kubectl("exec", "-n", NS, pod, "-c", "postgres", "--", "stat", "-c", "%i",
                       f"/var/lib/postgresql/data/pgdata/{relpath}", check=False)  # fmt: skip
    return res.stdout.strip() if res.returncode == 0 else ""


def server_version(kube: Kube) -> str:
    with connect_app(kube, NS, NAME) as conn:
        return str(conn.execute("show server_version").fetchone()[0])


def test_a_failing_check_refuses_the_upgrade_and_the_cluster_keeps_serving(cluster: Kube) -> None:
    # PostgreSQL 16's base backup, for the restore to a time before the upgrade (runs meanwhile).
    apply_objects(cluster, backup("before-upgrade", NS, NAME))
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


HISTORY: dict[str, Any] = {}


def test_the_upgrade_keeps_every_acknowledged_write(cluster: Kube) -> None:
    assert wait_backup(cluster, NS, "before-upgrade", 600)["phase"] == "Completed"
    with connect_app(cluster, NS, NAME) as conn:
        conn.execute("DROP TABLE lookups")
        # Rows 1-100 before the target time, 101-200 after it; all on 16.
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(1, 100)")
        time.sleep(1.5)
        (target,) = conn.execute("SELECT now()").fetchone()
        time.sleep(1.5)
        conn.execute("INSERT INTO items SELECT generate_series(101, 200)")
    HISTORY["target"] = target.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with connect_app(cluster, NS, NAME) as conn:
        (items_file,) = conn.execute("SELECT pg_relation_filepath('items')").fetchone()
    replica = next(i["name"] for i in status(cluster, NS, NAME)["instances"] if i["role"] == "replica")
    wait_until("the replica to have the table's file", lambda: inode(cluster, replica, items_file), 60, 1)
    before = inode(cluster, replica, items_file)
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
        "seed_s": state.get("seedSeconds"),
        "seed_bytes": state.get("seedBytes"),
    }
    print(json.dumps(figures), flush=True)
    assert lost == []
    # The replica was at the primary's shutdown checkpoint, so it kept its data: the new cluster's data
    # files are its old ones (the same inode under the same name: pg_upgrade keeps relation file names),
    # not a re-clone's fresh copies.
    assert state["replicas"] == {replica: "linked"}, state.get("replicas")
    assert inode(cluster, replica, items_file) == before
    assert server_version(cluster) == BUILT_VERSIONS["17"][0]
    found = reasons(cluster)
    for reason in ("MajorUpgradeCheckPassed", "MajorUpgradeStarting", "MajorUpgradePrimaryWritable",
                   "MajorUpgradeReplicasBack", "MajorUpgradeCompleted"):  # fmt: skip
        assert reason in found, sorted(found)
    assert "write outage" in found["MajorUpgradeCompleted"]
    st = status(cluster, NS, NAME)
    assert sorted(i["role"] for i in st["instances"]) == ["primary", "replica"]
    assert all(i["ready"] for i in st["instances"])
    HISTORY["acked"] = list(writer.acked)


def test_the_new_major_archives_to_a_generation_of_its_own_and_gets_a_base_backup(
    cluster: Kube, moto: Moto
) -> None:
    meta = get_json(cluster, "pgc", NAME, "-n", NS)["metadata"]
    gens = generations.parse(meta["annotations"][generations.ANNOTATION])
    assert [(g.server_name, g.major) for g in gens] == [(NAME, "16"), (f"{NAME}-pg17", "17")]
    assert "BackupGenerationStarted" in reasons(cluster)
    base = wait_backup(cluster, NS, f"{NAME}-pg17-base", 600)
    assert base["phase"] == "Completed" and base["serverName"] == f"{NAME}-pg17", base
    wait_condition(cluster, NS, NAME, "LastBackupSucceeded", "True", None, 120)
    wait_condition(cluster, NS, NAME, "ContinuousArchiving", "True", "Archiving", 240)
    shown = (status(cluster, NS, NAME).get("backup") or {}).get("generations") or []
    assert [(g["serverName"], g["major"]) for g in shown] == [(NAME, "16"), (f"{NAME}-pg17", "17")], shown
    # Every acknowledged row in 17's archive before the restore to the latest point is asked for.
    archived_after_switch(cluster, NS, NAME)
    assert moto.keys(f"e2e/{NAME}-pg17/wals/") and moto.keys(f"e2e/{NAME}-pg17/base/")
    document = moto.client().get_object(Bucket="e2e-backups", Key=f"e2e/{NAME}/{generations.STORE_FILE}")
    stored = generations.parse(document["Body"].read(), "store")
    assert stored == gens
    HISTORY["generations"] = gens


def _restore(name: str, version: str, moto: Moto, **target: Any) -> list[dict[str, Any]]:
    """The restored cluster and its own credentials Secret, which it reads the source's store with."""
    source = {"clusterName": NAME, "s3": s3(moto, name)}
    bootstrap = {"recovery": {"source": source, **target}}
    return [credentials(moto, NS, name), backup_cluster(name, NS, 1, version=version, bootstrap=bootstrap)]


def test_restores_pick_the_generation_by_their_target(cluster: Kube, moto: Moto) -> None:
    assert HISTORY.get("generations"), "needs the upgrade and its base backup"
    apply_objects(
        cluster,
        *_restore("upg-pitr16", "16", moto, targetTime=HISTORY["target"]),
        *_restore("upg-latest17", "17", moto),
        *_restore("upg-wrong", "17", moto, targetTime=HISTORY["target"]),
    )

    def refused() -> str | None:
        for c in status(cluster, NS, "upg-wrong").get("conditions") or ():
            if c.get("reason") == "RecoveryMajorMismatch":
                return str(c.get("message"))
        return None

    message = wait_until("the restore into the wrong major to be refused", refused, 120, 3)
    assert "PostgreSQL 16" in message and "spec.version is 17" in message, message
    assert not get_json(cluster, "statefulsets", "-n", NS, "-l", "db.example.com/cluster=upg-wrong")["items"]

    wait_serving(cluster, NS, "upg-pitr16", 1, 900)
    with connect_app(cluster, NS, "upg-pitr16") as conn:
        assert str(conn.execute("show server_version").fetchone()[0]) == BUILT_VERSIONS["16"][0]
        assert [r[0] for r in conn.execute("SELECT id FROM items ORDER BY id")] == list(range(1, 101))
    wait_serving(cluster, NS, "upg-latest17", 1, 900)
    with connect_app(cluster, NS, "upg-latest17") as conn:
        assert str(conn.execute("show server_version").fetchone()[0]) == BUILT_VERSIONS["17"][0]
        assert [r[0] for r in conn.execute("SELECT id FROM items ORDER BY id")] == list(range(1, 201))
        present = {r[0] for r in conn.execute("SELECT id FROM upgrade_writes")}
    assert [n for n in HISTORY["acked"] if n not in present] == []
