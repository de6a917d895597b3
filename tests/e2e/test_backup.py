"""Backups on real pods (full profile) against a real S3 server (moto, authentication on), reached by the
pods and the operator at the host side of the pod bridge: WAL archiving with its condition, a
ScheduledBackup's first Backup taken on a replica, point-in-time and latest restores into new clusters,
archiving from the new primary after a failover, the store emptied (or kept) when a cluster is deleted,
and bad credentials, a missing bucket and an unreachable endpoint each reported by a condition and an
Event while the cluster keeps serving.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pgcluster import connect_app, get_json, status, wait_serving, wait_until

from conftest import Kube

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from backup_harness import S3Server, s3_server

BRIDGE_HOST = os.environ.get("PGOP_E2E_HOST_IP", "10.244.0.1")  # the host, as pods see it
BUCKET = "e2e-backups"
SMALL = {"requests": {"cpu": "100m", "memory": "384Mi"}}


@dataclass
class Moto:
    """The integration tests' moto server (authentication on), listening on every address of this
    (private) network namespace so the pods reach it at the host side of the pod bridge."""

    server: S3Server = field(repr=False)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def access_key_id(self) -> str:
        return self.server.access_key_id

    @property
    def secret_access_key(self) -> str:
        return self.server.secret_access_key

    @property
    def pod_endpoint(self) -> str:
        return f"http://{BRIDGE_HOST}:{self.port}"

    def client(self) -> Any:
        return self.server.client()

    def keys(self, prefix: str) -> list[str]:
        return self.server.keys(BUCKET, prefix)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moto]:
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
    with s3_server(tmp_path_factory.mktemp("moto"), bind="0.0.0.0", user="e2e") as server:  # noqa: S104
        server_ = Moto(server)
        server_.client().create_bucket(Bucket=BUCKET)
        yield server_


@pytest.fixture(scope="module")
def ns(operator: Kube, moto: Moto) -> Iterator[str]:
    name = f"bk-{uuid.uuid4().hex[:6]}"
    operator.kubectl("create", "namespace", name)
    for secret_name, secret_key in (("s3-creds", moto.secret_access_key), ("s3-wrong", "not-the-secret-key")):
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name, "namespace": name},
                "data": {"ACCESS_KEY_ID": base64.b64encode(moto.access_key_id.encode()).decode(),
                         "ACCESS_SECRET_KEY": base64.b64encode(secret_key.encode()).decode()}}  # fmt: skip
        operator.kubectl("apply", "-f", "-", input=json.dumps(body))
    yield name
    # Clusters whose store is gone must not hold the namespace: release them by hand first.
    for item in get_json(operator, "pgc", "-n", name)["items"]:
        operator.kubectl("annotate", "pgc", item["metadata"]["name"], "-n", name,
                         "db.example.com/release-backup-store=true", "--overwrite", check=False)  # fmt: skip
    operator.kubectl("delete", "namespace", name, "--ignore-not-found", timeout=300)


def s3(
    moto: Moto,
    *,
    bucket: str = BUCKET,
    endpoint: str | None = None,
    secret: str = "s3-creds",  # noqa: S107
) -> dict[str, Any]:
    return {"endpointURL": endpoint or moto.pod_endpoint, "bucket": bucket, "path": "e2e",
            "credentials": {"secretName": secret}}  # fmt: skip


def cluster(name: str, ns: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "version": "16", "storage": "1Gi", "resources": SMALL,
                     **spec}}  # fmt: skip


def apply(kube: Kube, obj: dict[str, Any]) -> None:
    kube.kubectl("apply", "-f", "-", input=json.dumps(obj))


def condition(kube: Kube, ns: str, name: str, type_: str) -> dict[str, Any]:
    for cond in status(kube, ns, name).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def wait_condition(
    kube: Kube, ns: str, name: str, type_: str, want: str, reason: str | None, timeout: float
) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        cond = condition(kube, ns, name, type_)
        if cond.get("status") == want and (reason is None or cond.get("reason") == reason):
            return cond
        return None

    try:
        return dict(wait_until(f"{name} {type_}={want}/{reason}", ok, timeout, 3))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last: {condition(kube, ns, name, type_)}") from None


def backup(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return dict(get_json(kube, "backups.db.example.com", name, "-n", ns))


def wait_backup(kube: Kube, ns: str, name: str, timeout: float) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        st = backup(kube, ns, name).get("status") or {}
        return st if st.get("phase") in ("Completed", "Failed") else None

    return dict(wait_until(f"Backup {name} to finish", finished, timeout, 3))


def events(kube: Kube, ns: str, kind: str, name: str) -> list[dict[str, Any]]:
    sel = f"involvedObject.kind={kind},involvedObject.name={name}"
    return list(get_json(kube, "events", "-n", ns, "--field-selector", sel)["items"])


def rows(kube: Kube, ns: str, name: str) -> list[int]:
    with connect_app(kube, ns, name) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM items ORDER BY id").fetchall()]


def superuser_sql(kube: Kube, ns: str, pod: str, sql: str) -> str:
    """SQL as the superuser over the pod's Unix socket (what the operator's own execs do)."""
    res = kube.kubectl("exec", pod, "-n", ns, "-c", "postgres", "--",
                       "psql", "-h", "/var/run/postgresql", "-U", "postgres", "-AtX", "-c", sql)  # fmt: skip
    return str(res.stdout).strip()


def archived_after_switch(kube: Kube, ns: str, name: str, timeout: float = 120) -> str:
    """Switch WAL on the primary and wait until the operator reports that segment archived."""
    primary = str(status(kube, ns, name)["currentPrimary"])
    segment = superuser_sql(kube, ns, primary, "SELECT pg_walfile_name(pg_current_wal_lsn())")
    superuser_sql(kube, ns, primary, "SELECT pg_switch_wal()")

    def archived() -> bool:
        last = ((status(kube, ns, name).get("backup") or {}).get("archiving") or {}).get(
            "lastArchivedWAL"
        ) or ""
        return bool(last) and last[:8] >= segment[:8] and last[8:] >= segment[8:]

    wait_until(f"{name} to archive {segment}", archived, timeout, 3)
    return segment


# --- the source cluster ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(operator: Kube, ns: str, moto: Moto) -> str:
    apply(
        operator,
        cluster("src-db", ns, 2, backup={"s3": s3(moto), "archiveTimeout": "10s", "onDelete": "delete"}),
    )
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


def test_scheduled_backup_completes_on_a_replica(operator: Kube, ns: str, source: str, moto: Moto) -> None:
    # A replica counts as healthy once Patroni reports it streaming from the primary (what the placement
    # reads); right after the cluster turns Ready it may still be catching up, and the primary takes it.
    def streaming_replica() -> bool:
        selector = f"db.example.com/cluster={source},role=replica"
        pods = get_json(operator, "pods", "-n", ns, "-l", selector)["items"]
        states = [json.loads((p["metadata"].get("annotations") or {}).get("status") or "{}") for p in pods]
        return any(st.get("replication_state") == "streaming" for st in states)

    wait_until("a replica streaming from the primary", streaming_replica, 180, 2)
    apply(operator, {"apiVersion": "db.example.com/v1alpha1", "kind": "ScheduledBackup",
                     "metadata": {"name": "nightly", "namespace": ns},
                     "spec": {"cluster": source, "schedule": "0 3 * * *", "immediate": True}})  # fmt: skip
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


def recovery(moto: Moto, source: str, **target: Any) -> dict[str, Any]:
    return {"recovery": {"source": {"clusterName": source, "s3": s3(moto)}, **target}}


def test_restore_to_a_point_in_time(
    operator: Kube, ns: str, source: str, moto: Moto, history: dict[str, Any]
) -> None:
    before = moto.keys(f"e2e/{source}/")
    apply(operator, cluster("pitr-db", ns, 1, bootstrap=recovery(moto, source, targetTime=history["target"])))
    wait_serving(operator, ns, "pitr-db", 1, 900)
    assert rows(operator, ns, "pitr-db") == list(range(1, 101))
    assert set(before) <= set(moto.keys(f"e2e/{source}/"))  # the source's archive is left as it was


def test_restore_to_the_latest_point(
    operator: Kube, ns: str, source: str, moto: Moto, history: dict[str, Any]
) -> None:
    own = {"s3": s3(moto), "archiveTimeout": "10s", "onDelete": "keep"}
    apply(operator, cluster("latest-db", ns, 1, bootstrap=recovery(moto, source), backup=own))
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


@pytest.mark.parametrize(
    ("name", "store", "reason"),
    [("badcred-db", {"secret": "s3-wrong"}, "InvalidCredentials"),
     ("nobucket-db", {"bucket": "no-such-bucket"}, "BucketNotFound"),
     ("noendpoint-db", {"endpoint": f"http://{BRIDGE_HOST}:9"}, "EndpointUnreachable")],
)  # fmt: skip
def test_a_broken_store_is_reported_and_the_cluster_keeps_serving(
    operator: Kube, ns: str, moto: Moto, name: str, store: dict[str, str], reason: str
) -> None:
    apply(operator, cluster(name, ns, 1, backup={"s3": s3(moto, **store), "archiveTimeout": "10s"}))
    wait_serving(operator, ns, name, 1, 900)
    with connect_app(operator, ns, name) as conn:
        conn.execute("CREATE TABLE t (id int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 50)")
    cond = wait_condition(operator, ns, name, "ContinuousArchiving", "False", reason, 300)
    assert "piling up" in cond["message"] or reason in cond["reason"]
    once = {"name": f"{name}-once", "namespace": ns}
    apply(operator, {"apiVersion": "db.example.com/v1alpha1", "kind": "Backup", "metadata": once,
                     "spec": {"cluster": name}})  # fmt: skip
    st = wait_backup(operator, ns, f"{name}-once", 300)
    assert st["phase"] == "Failed" and st["error"].startswith(reason), st
    wait_condition(operator, ns, name, "LastBackupSucceeded", "False", reason, 60)
    warned = {e["reason"] for e in events(operator, ns, "PostgresCluster", name) if e["type"] == "Warning"}
    assert reason in warned and "BackupFailed" in warned, warned
    # Nothing lost, no crash loop: the cluster serves, its rows are there, its container never restarted.
    assert condition(operator, ns, name, "Ready")["status"] == "True"
    with connect_app(operator, ns, name) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
    pod = get_json(operator, "pod", f"{name}-0", "-n", ns)
    assert all(c.get("restartCount", 0) == 0 for c in pod["status"]["containerStatuses"])
    for e in events(operator, ns, "PostgresCluster", name):
        assert "not-the-secret-key" not in e.get("message", "")
    operator.kubectl("delete", "pgc", name, "-n", ns, "--wait=false")


def test_deleting_with_keep_leaves_the_objects(
    operator: Kube, ns: str, moto: Moto, history: dict[str, Any]
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
