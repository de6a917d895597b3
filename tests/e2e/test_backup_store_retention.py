"""Retention on real pods (full profile) against a real S3 server (moto, authentication on): a cluster
with `retention: {keepLast: 2}` takes three Backups; the operator's retention pass removes the oldest
base backup and the WAL only it needed, deletes its Backup object, keeps the WAL the other two need (a
point-in-time restore replays it), and a tightened policy is applied at once, without a new backup
(retention runs when its outcome can change, never on a timer of its own).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from typing import Any

import pytest

from harness.e2e_backup import (
    Moto,
    archived_after_switch,
    backup_cluster,
    credentials,
    get_backup,
    rows,
    s3,
    wait_backup,
)
from harness.kube import apply_objects, events
from harness.local_cluster import Kube
from harness.objects import backup
from harness.pgcluster import connect_app, status, wait_serving
from harness.waiting import wait_until
from pg_operator.backup.barman import ObjectStore, backup_list_argv

NAME = "ret-db"
SEGMENT = re.compile(r"/wals/[0-9A-F]{16}/([0-9A-F]{24})(\.[0-9A-F]{8}\.backup)?(\.gz)?$")


def segments(keys: list[str]) -> set[str]:
    """WAL segment names (24 hex digits) of the archived segments and backup-label files."""
    return {m.group(1) for k in keys if (m := SEGMENT.search(k))}


def store_ids(moto: Moto, prefix: str) -> set[str]:
    return {k[len(prefix) :].split("/", 1)[0] for k in moto.keys(prefix)}


def take_backup(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    apply_objects(kube, backup(name, ns, NAME))
    st = wait_backup(kube, ns, name, 600)
    assert st["phase"] == "Completed", st
    return st


def insert(kube: Kube, ns: str, first: int, last: int) -> None:
    with connect_app(kube, ns, NAME) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(%s::int, %s::int)", (first, last))


def backup_exists(kube: Kube, ns: str, name: str) -> bool:
    res = kube.kubectl("get", "backups.db.example.com", name, "-n", ns, "--ignore-not-found", "-o", "name")
    return bool(res.stdout.strip())


def listed_in_pod(kube: Kube, ns: str, moto: Moto) -> list[dict[str, Any]]:
    """barman-cloud-backup-list run in the cluster's primary pod (its environment has the credentials)."""
    store = ObjectStore(bucket="e2e-backups", server_name=NAME, path="e2e", endpoint_url=moto.pod_endpoint)
    pod = str(status(kube, ns, NAME)["currentPrimary"])
    res = kube.kubectl("exec", pod, "-n", ns, "-c", "postgres", "--", *backup_list_argv(store))
    return list(json.loads(res.stdout)["backups_list"])


@pytest.fixture(scope="module")
def history(operator: Kube, ns: str, moto: Moto) -> dict[str, Any]:
    """Three Backups one after the other, rows written between them, and the store as it was before the
    third (nothing for retention to remove yet)."""
    spec = {"s3": s3(moto, NAME), "archiveTimeout": "10s", "retention": {"keepLast": 2}}
    apply_objects(operator, credentials(moto, ns, NAME), backup_cluster(NAME, ns, 1, backup=spec))
    wait_serving(operator, ns, NAME, 1, 900)
    insert(operator, ns, 1, 50)
    first = take_backup(operator, ns, "ret-1")
    insert(operator, ns, 51, 100)
    second = take_backup(operator, ns, "ret-2")
    insert(operator, ns, 101, 150)
    with connect_app(operator, ns, NAME) as conn:
        time.sleep(1.5)
        (target,) = conn.execute("SELECT now()").fetchone()  # type: ignore[misc]
        time.sleep(1.5)
    insert(operator, ns, 151, 200)
    archived_after_switch(operator, ns, NAME)
    before = moto.keys(f"e2e/{NAME}/")
    third = take_backup(operator, ns, "ret-3")
    stamp = target.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"backups": [first, second, third], "before": before, "target": stamp}


def test_keep_last_two_removes_the_oldest_backup_its_wal_and_its_record(
    operator: Kube, ns: str, moto: Moto, history: dict[str, Any]
) -> None:
    first, second, third = history["backups"]
    base = f"e2e/{NAME}/base/"
    before: list[str] = history["before"]
    # Before the third backup both earlier ones were in the store, with WAL from before the second.
    assert {first["backupID"], second["backupID"]} <= {k[len(base) :].split("/", 1)[0] for k in before
                                                       if k.startswith(base)}  # fmt: skip
    old_wal = {s for s in segments(before) if s < second["beginWal"]}
    assert old_wal, f"no WAL older than {second['beginWal']} was archived: {sorted(segments(before))}"
    assert first["beginWal"] in old_wal

    wait_until("retention to remove the oldest base backup",
               lambda: store_ids(moto, base) == {second["backupID"], third["backupID"]}, 180, 3)  # fmt: skip
    wait_until("the Backup object of the removed base backup to go",
               lambda: not backup_exists(operator, ns, "ret-1"), 120, 2)  # fmt: skip

    after = moto.keys(f"e2e/{NAME}/")
    assert not [k for k in after if k.startswith(f"{base}{first['backupID']}/")]
    left = segments(after)
    assert not {s for s in left if s < second["beginWal"]}, sorted(left)
    # Every segment from the second backup's begin WAL on that was archived before is still there.
    needed = {s for s in segments(before) if s >= second["beginWal"]}
    assert needed and needed <= left, sorted(needed - left)
    assert second["endWal"] in left and third["beginWal"] in left and third["endWal"] in left

    # barman's own view, from the cluster's pod: the two newest, both complete.
    listed = listed_in_pod(operator, ns, moto)
    assert sorted(b["backup_id"] for b in listed) == sorted([second["backupID"], third["backupID"]])
    assert {b["status"] for b in listed} == {"DONE"}

    # The records: the removed one's Backup is gone, the kept ones are Completed; Events say why.
    assert get_backup(operator, ns, "ret-2")["status"]["phase"] == "Completed"
    assert get_backup(operator, ns, "ret-3")["status"]["phase"] == "Completed"
    messages = {(e["reason"], e["message"]) for e in events(operator, ns, "PostgresCluster", NAME)}
    assert any(r == "BackupDeleted" and first["backupID"] in m for r, m in messages), messages
    assert any(r == "BackupRecordDeleted" and "ret-1" in m for r, m in messages), messages
    last = (status(operator, ns, NAME).get("backup") or {}).get("lastSuccessfulBackup")
    assert last == "ret-3"


def test_a_point_in_time_restore_replays_the_kept_wal(
    operator: Kube, ns: str, moto: Moto, history: dict[str, Any]
) -> None:
    # The target lies after the second backup and before the third: the second backup plus the WAL
    # archived after it, all of which retention had to keep.
    source = {"clusterName": NAME, "s3": s3(moto, "ret-restored")}
    recovery = {"recovery": {"source": source, "targetTime": history["target"]}}
    apply_objects(operator, credentials(moto, ns, "ret-restored"),
                  backup_cluster("ret-restored", ns, 1, bootstrap=recovery))  # fmt: skip
    wait_serving(operator, ns, "ret-restored", 1, 900)
    assert rows(operator, ns, "ret-restored") == list(range(1, 151))


def test_a_tightened_policy_is_applied_at_once(
    operator: Kube, ns: str, moto: Moto, history: dict[str, Any]
) -> None:
    _, second, third = history["backups"]
    patch = {"spec": {"backup": {"retention": {"keepLast": 1}}}}
    operator.kubectl("patch", "pgc", NAME, "-n", ns, "--type=merge", "-p", json.dumps(patch))
    started = time.monotonic()
    # No backup completes now, and keepLast has no timer: the policy's change is what runs retention.
    base = f"e2e/{NAME}/base/"
    wait_until("retention after the policy change", lambda: store_ids(moto, base) == {third["backupID"]},
               150, 3)  # fmt: skip
    wait_until("the Backup object of the second backup to go",
               lambda: not backup_exists(operator, ns, "ret-2"), 120, 2)  # fmt: skip
    print(json.dumps({"measure": "retention after a policy change",
                      "seconds": round(time.monotonic() - started, 1)}), flush=True)  # fmt: skip
    assert get_backup(operator, ns, "ret-3")["status"]["phase"] == "Completed"
    assert not {s for s in segments(moto.keys(f"e2e/{NAME}/")) if s < third["beginWal"]}
    assert second["backupID"] not in {b["backup_id"] for b in listed_in_pod(operator, ns, moto)}
