"""Backups on real pods (full profile) against a real S3 server (moto, authentication on), reached by the
pods and the operator at the host side of the pod bridge: WAL archiving with its condition, a
ScheduledBackup's first Backup taken on a replica, point-in-time and latest restores into new clusters,
archiving from the new primary after a failover, the store emptied (or kept) when a cluster is deleted,
bad credentials, a missing bucket and an unreachable endpoint each reported by a condition and an
Event while the cluster keeps serving, and a same-named cluster in another namespace on the same bucket
and path refused the prefix (condition, Event, no archive, no base backup, still serving) and its
deletion with onDelete: delete leaving the owner's objects.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest

from harness.e2e_backup import (
    BRIDGE_HOST,
    BUCKET,
    Moto,
    archived_after_switch,
    backup_cluster,
    credentials,
    rows,
    s3,
    status_condition,
    superuser_sql,
    wait_backup,
    wait_condition,
)
from harness.kube import apply_objects, events, get_json
from harness.local_cluster import Kube
from harness.objects import backup, scheduled_backup
from harness.pgcluster import connect_app, status, wait_serving
from harness.waiting import wait_until
from pg_operator.backup.archive_report import REFRESH_SECONDS, ArchiveReport, parse_report
from pg_operator.backup.store_ownership import MARKER_NAME

# --- the source cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(operator: Kube, ns: str, moto: Moto) -> str:
    store = {"s3": s3(moto, "src-db"), "archiveTimeout": "10s", "onDelete": "delete"}
    apply_objects(operator, credentials(moto, ns, "src-db"), backup_cluster("src-db", ns, 2, backup=store))
    wait_serving(operator, ns, "src-db", 2, 900)
    return "src-db"


def test_archiving_is_reported_and_the_age_metric_exists(operator: Kube, ns: str, source: str) -> None:
    cond = wait_condition(operator, ns, source, "ContinuousArchiving", "True", "Archiving", 240)
    primary = status(operator, ns, source)["currentPrimary"]
    assert primary in cond["message"]
    archiving = status(operator, ns, source)["backup"]["archiving"]
    assert archiving["primary"] == primary and archiving["lastArchivedWAL"]
    finalizers = get_json(operator, "pgc", source, "-n", ns)["metadata"].get("finalizers") or []
    assert "db.example.com/backup-store" in finalizers


def test_the_primary_reports_its_archiving_and_progress_rewrites_no_status(
    operator: Kube, ns: str, source: str
) -> None:
    # The instance publishes pg_stat_archiver and the gate it holds in its pod; the operator wrote the gate
    # once and reads the report from there, so new segments rewrite neither the report at once nor the
    # cluster's status.
    primary = str(status(operator, ns, source)["currentPrimary"])

    def report() -> ArchiveReport | None:
        pod = get_json(operator, "pod", primary, "-n", ns)
        return parse_report(pod["metadata"].get("annotations"))

    def gate_open() -> ArchiveReport | None:
        r = report()
        return r if r is not None and r.stats.archived_count and r.gate.startswith("archive ") else None

    first = wait_until("the primary's archiving report with the gate open", gate_open, 60, 2)
    before = get_json(operator, "pgc", source, "-n", ns)["status"]["backup"]["archiving"]
    for _ in range(3):
        archived_after_switch(operator, ns, source)
    after = get_json(operator, "pgc", source, "-n", ns)["status"]["backup"]["archiving"]
    assert after == before

    def caught_up() -> bool:  # within the refresh interval, the segments archived meanwhile
        r = report()
        return r is not None and r.stats.archived_count >= first.stats.archived_count + 3

    wait_until("the report to show the new segments", caught_up, REFRESH_SECONDS + 30, 3)


def test_scheduled_backup_completes_on_a_replica(operator: Kube, ns: str, source: str, moto: Moto) -> None:
    # A replica counts as healthy once Patroni reports it streaming from the primary (what the placement
    # reads); right after the cluster turns Ready it may still be catching up, and the primary takes it.
    def streaming_replica() -> bool:
        selector = f"db.example.com/cluster={source},role=replica"
        pods = get_json(operator, "pods", "-n", ns, "-l", selector)["items"]
        states = [json.loads((p["metadata"].get("annotations") or {}).get("status") or "{}") for p in pods]
        return any(st.get("replication_state") == "streaming" for st in states)

    wait_until("a replica streaming from the primary", streaming_replica, 180, 2)
    apply_objects(operator, scheduled_backup("nightly", ns, source, "0 3 * * *", immediate=True))
    name = wait_until(
        "the immediate Backup",
        lambda: (
            get_json(operator, "scheduledbackups.db.example.com", "nightly", "-n", ns).get("status") or {}
        ).get("lastBackupName"),
        60,
        2,
    )
    started = time.monotonic()
    st = wait_backup(operator, ns, str(name), 600)
    print(json.dumps({"measure": "scheduled base backup", "seconds": round(time.monotonic() - started, 1),
                      "size": st.get("size"), "instance": st.get("instance")}), flush=True)  # fmt: skip
    assert st["phase"] == "Completed", st
    primary = status(operator, ns, source)["currentPrimary"]
    assert st["instance"] != primary, "a healthy replica should take the base backup"
    assert st["backupID"] and st["beginWal"] and st["endWal"] and st["startedAt"] and st["stoppedAt"]
    assert st["size"] > 0 and st["serverName"] == source
    assert moto.keys(f"e2e/{source}/base/{st['backupID']}/")
    wait_condition(operator, ns, source, "LastBackupSucceeded", "True", "BackupCompleted", 60)


@pytest.fixture(scope="module")
def history(operator: Kube, ns: str, source: str) -> dict[str, Any]:
    """100 rows, then the target time T, then 100 more, all archived."""
    test_scheduled = get_json(operator, "backups.db.example.com", "-n", ns)["items"]
    assert any((b.get("status") or {}).get("phase") == "Completed" for b in test_scheduled), "no base backup"
    with connect_app(operator, ns, source) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(1, 100)")
        time.sleep(1.5)
        (target,) = conn.execute("SELECT now()").fetchone()  # type: ignore[misc]
        time.sleep(1.5)
        conn.execute("INSERT INTO items SELECT generate_series(101, 200)")
    archived_after_switch(operator, ns, source)
    stamp = target.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"target": stamp}


def recovery(moto: Moto, source: str, restored: str, **target: Any) -> dict[str, Any]:
    """spec.bootstrap of `restored` from `source`'s backups, read with `restored`'s own credentials."""
    return {"recovery": {"source": {"clusterName": source, "s3": s3(moto, restored)}, **target}}


@pytest.fixture(scope="module")
def restores(operator: Kube, ns: str, source: str, moto: Moto, history: dict[str, Any]) -> dict[str, Any]:
    """Both restores asked for at once (they wait on different things): pitr-db to the target time,
    latest-db to the latest point with a store of its own; and the source's archive as it was before."""
    before = moto.keys(f"e2e/{source}/")
    own = {"s3": s3(moto, "latest-db"), "archiveTimeout": "10s", "onDelete": "keep"}
    to_time = recovery(moto, source, "pitr-db", targetTime=history["target"])
    latest = recovery(moto, source, "latest-db")
    apply_objects(operator, credentials(moto, ns, "pitr-db"), credentials(moto, ns, "latest-db"),
                  backup_cluster("pitr-db", ns, 1, bootstrap=to_time),
                  backup_cluster("latest-db", ns, 1, bootstrap=latest, backup=own))  # fmt: skip
    return {"source_keys_before": before}


def test_restore_to_a_point_in_time(
    operator: Kube, ns: str, source: str, moto: Moto, restores: dict[str, Any]
) -> None:
    wait_serving(operator, ns, "pitr-db", 1, 900)
    assert rows(operator, ns, "pitr-db") == list(range(1, 101))
    # The source's archive is left as it was.
    assert set(restores["source_keys_before"]) <= set(moto.keys(f"e2e/{source}/"))


def test_restore_to_the_latest_point(operator: Kube, ns: str, moto: Moto, restores: dict[str, Any]) -> None:
    wait_serving(operator, ns, "latest-db", 1, 900)
    assert rows(operator, ns, "latest-db") == list(range(1, 201))
    wait_condition(operator, ns, "latest-db", "ContinuousArchiving", "True", "Archiving", 240)
    assert moto.keys("e2e/latest-db/wals/")  # it archives under its own name


def test_archiving_continues_from_the_new_primary_after_a_failover(
    operator: Kube, ns: str, source: str, history: dict[str, Any]
) -> None:
    old = status(operator, ns, source)["currentPrimary"]
    operator.kubectl("delete", "pod", old, "-n", ns, "--wait=false")
    new = wait_until(
        "a new primary",
        lambda: (p := status(operator, ns, source).get("currentPrimary")) and p != old and p,
        180,
        2,
    )
    wait_serving(operator, ns, source, 2, 600)

    def write() -> bool:
        # The -rw Service may still route to the old primary (now a replica) for a moment.
        with connect_app(operator, ns, source) as conn:
            conn.execute("INSERT INTO items SELECT generate_series(201, 210)")
        return True

    wait_until("a write through -rw to the new primary", write, 120, 2)
    segment = archived_after_switch(operator, ns, source, 240)
    archiving = status(operator, ns, source)["backup"]["archiving"]
    assert archiving["primary"] == new
    assert int(segment[:8], 16) >= 2, segment  # a new timeline
    wait_condition(operator, ns, source, "ContinuousArchiving", "True", "Archiving", 120)


BROKEN_STORES = [
    ("badcred-db", {}, "InvalidCredentials"),
    ("nobucket-db", {"bucket": "no-such-bucket"}, "BucketNotFound"),
    ("noendpoint-db", {"endpoint": f"http://{BRIDGE_HOST}:9"}, "EndpointUnreachable"),
]
WRONG_KEYS = {"badcred-db": "not-the-secret-key"}  # the credentials Secret of these holds a wrong key


@pytest.fixture(scope="module")
def broken_stores(operator: Kube, ns: str, moto: Moto) -> None:
    """One single-instance cluster per broken store, asked for at once."""
    stores = {name: {"s3": s3(moto, name, **store), "archiveTimeout": "10s"}
              for name, store, _ in BROKEN_STORES}  # fmt: skip
    secrets = [credentials(moto, ns, name, secret_key=WRONG_KEYS.get(name)) for name in stores]
    apply_objects(operator, *secrets,
                  *(backup_cluster(name, ns, 1, backup=store) for name, store in stores.items()))  # fmt: skip


@pytest.mark.parametrize(("name", "store", "reason"), BROKEN_STORES)
def test_a_broken_store_is_reported_and_the_cluster_keeps_serving(
    operator: Kube, ns: str, broken_stores: None, name: str, store: dict[str, str], reason: str
) -> None:
    wait_serving(operator, ns, name, 1, 900)
    with connect_app(operator, ns, name) as conn:
        conn.execute("CREATE TABLE t (id int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 50)")
    cond = wait_condition(operator, ns, name, "ContinuousArchiving", "False", reason, 300)
    assert "piling up" in cond["message"] or reason in cond["reason"]
    apply_objects(operator, backup(f"{name}-once", ns, name))
    st = wait_backup(operator, ns, f"{name}-once", 300)
    assert st["phase"] == "Failed" and st["error"].startswith(reason), st
    wait_condition(operator, ns, name, "LastBackupSucceeded", "False", reason, 60)
    warned = {e["reason"] for e in events(operator, ns, "PostgresCluster", name) if e["type"] == "Warning"}
    assert reason in warned and "BackupFailed" in warned, warned
    # Nothing lost, no crash loop: the cluster serves, its rows are there, its container never restarted.
    assert status_condition(operator, ns, name, "Ready")["status"] == "True"
    with connect_app(operator, ns, name) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
    pod = get_json(operator, "pod", f"{name}-0", "-n", ns)
    assert all(c.get("restartCount", 0) == 0 for c in pod["status"]["containerStatuses"])
    for e in events(operator, ns, "PostgresCluster", name):
        assert "not-the-secret-key" not in e.get("message", "")
    operator.kubectl("delete", "pgc", name, "-n", ns, "--wait=false")


def test_deleting_with_keep_leaves_the_objects(
    operator: Kube, ns: str, moto: Moto, restores: dict[str, Any]
) -> None:
    keys = moto.keys("e2e/latest-db/")
    assert keys
    operator.kubectl("delete", "pgc", "latest-db", "-n", ns, timeout=300)
    assert set(keys) <= set(moto.keys("e2e/latest-db/"))


def test_deleting_with_delete_empties_the_prefix_and_releases_the_finalizer(
    operator: Kube, ns: str, source: str, moto: Moto, history: dict[str, Any]
) -> None:
    assert moto.keys(f"e2e/{source}/")
    operator.kubectl("delete", "pgc", source, "-n", ns, timeout=400)  # waits for the finalizer's release
    assert moto.keys(f"e2e/{source}/") == []
    reasons = {e["reason"] for e in events(operator, ns, "PostgresCluster", source)}
    assert "BackupStoreDeleted" in reasons, reasons


# --- two same-named clusters on one bucket and path -----------------------------------------------------


def store_objects(moto: Moto, prefix: str) -> dict[str, str]:
    """Every object under the prefix with its ETag (an overwritten object changes its ETag)."""
    out: dict[str, str] = {}
    for page in moto.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
    return out


def test_a_same_named_cluster_elsewhere_refuses_the_prefix_and_deleting_it_leaves_the_owners_objects(
    operator: Kube, ns: str, moto: Moto
) -> None:
    name, prefix = "dup", "e2e/dup/"
    # The owner: `dup` in this module's namespace, onDelete keep, with WAL archived and a base backup.
    owner_store = {"s3": s3(moto, name), "archiveTimeout": "10s", "onDelete": "keep"}
    apply_objects(operator, credentials(moto, ns, name), backup_cluster(name, ns, 1, backup=owner_store))
    wait_serving(operator, ns, name, 1, 900)
    # An idle new cluster may not finish its first segment for minutes: switch one.
    archived_after_switch(operator, ns, name, 300)
    wait_condition(operator, ns, name, "ContinuousArchiving", "True", "Archiving", 120)
    apply_objects(operator, backup("dup-owner-once", ns, name))
    assert wait_backup(operator, ns, "dup-owner-once", 600)["phase"] == "Completed"
    owner_uid = get_json(operator, "pgc", name, "-n", ns)["metadata"]["uid"]
    marker = json.loads(moto.client().get_object(Bucket=BUCKET, Key=prefix + MARKER_NAME)["Body"].read())
    assert (marker["namespace"], marker["name"], marker["uid"]) == (ns, name, owner_uid), marker
    claimed = {e["reason"] for e in events(operator, ns, "PostgresCluster", name)}
    assert "StorePrefixClaimed" in claimed, claimed

    # The second: `dup` in another namespace, same bucket and path, onDelete delete.
    other_ns = f"{ns}-b"
    operator.kubectl("create", "namespace", other_ns)
    before = store_objects(moto, prefix)
    second_store = {"s3": s3(moto, name), "archiveTimeout": "10s", "onDelete": "delete"}
    apply_objects(operator, credentials(moto, other_ns, name),
                  backup_cluster(name, other_ns, 1, backup=second_store))  # fmt: skip
    wait_serving(operator, other_ns, name, 1, 900)
    refusal = "StorePrefixOwnedElsewhere"
    cond = wait_condition(operator, other_ns, name, "ContinuousArchiving", "False", refusal, 180)
    assert f"s3://{BUCKET}/{prefix}" in cond["message"] and owner_uid in cond["message"], cond
    assert f"{ns}/{name}" in cond["message"], cond
    warned = [e for e in events(operator, other_ns, "PostgresCluster", name)
              if e["type"] == "Warning" and e["reason"] == refusal]  # fmt: skip
    assert warned and f"s3://{BUCKET}/{prefix}" in warned[0]["message"] and owner_uid in warned[0]["message"]

    # It keeps serving writes, and its WAL does not pile up: segments switched are recycled, not kept.
    with connect_app(operator, other_ns, name) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(1, 500)")
    primary = str(status(operator, other_ns, name)["currentPrimary"])
    for _ in range(3):
        superuser_sql(operator, other_ns, primary, "SELECT pg_switch_wal()")
        with connect_app(operator, other_ns, name) as conn:
            conn.execute("INSERT INTO items SELECT max(id) + 1 FROM items")

    def drained() -> bool:
        pending = "SELECT count(*) FROM pg_ls_archive_statusdir() WHERE name LIKE '%.ready'"
        return bool(superuser_sql(operator, other_ns, primary, pending) == "0")

    wait_until("the refused cluster's switched segments to be recycled, not kept", drained, 180, 3)
    assert rows(operator, other_ns, name) == list(range(1, 504))
    # No base backup into someone else's prefix either.
    apply_objects(operator, backup("dup-second-once", other_ns, name))
    refused = wait_backup(operator, other_ns, "dup-second-once", 300)
    assert refused["phase"] == "Failed" and refused["error"].startswith(refusal), refused

    # Deleting it with onDelete: delete leaves every object of the owner, unchanged, and does not hang.
    during = store_objects(moto, prefix)
    assert all(during.get(k) == etag for k, etag in before.items()), "an object of the owner changed"
    operator.kubectl("delete", "pgc", name, "-n", other_ns, timeout=400)  # waits for the finalizer
    after = store_objects(moto, prefix)
    missing = sorted(set(before) - set(after))
    changed = sorted(k for k in before if k in after and after[k] != before[k])
    assert not missing and not changed, (missing, changed)
    assert set(during) <= set(after)
    left = [e for e in events(operator, other_ns, "PostgresCluster", name)
            if e["reason"] == "StorePrefixNotOurs"]  # fmt: skip
    assert left and f"s3://{BUCKET}/{prefix}" in left[0]["message"], left
    # The owner still archives there.
    archived_after_switch(operator, ns, name, 240)
    operator.kubectl("delete", "namespace", other_ns, "--wait=false")
    operator.kubectl("delete", "pgc", name, "-n", ns, "--wait=false")
