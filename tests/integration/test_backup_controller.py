"""The backup controller against the real API server (kwok profile) and a real S3 server (moto, with
authentication, on loopback), where no process has to run in a pod: ScheduledBackups create Backups on
their schedule, a Backup that cannot run fails with a reason, and the object-store finalizer of
`onDelete: delete` (store emptied, other clusters' objects untouched, finalizer released), of `keep`
(nothing touched, no finalizer), of an unreachable store and of bad credentials (a condition and an
Event, retried; released by hand with the annotation), and the store prefix's ownership asked of the
store on events only (a claim, a spec.backup change, a Backup's start), never by a steady cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from harness.kube import apply, condition, events, get_json, get_or_none, make_namespace
from harness.net import free_port
from harness.objects import backup, cluster, s3_credentials_secret, scheduled_backup
from harness.operator_process import OperatorEnv, OperatorProcess, OperatorSpec
from harness.s3 import S3Server, s3_server
from harness.waiting import wait_until
from pg_operator.api.constants import ROLE_LABEL
from pg_operator.backup.store_cleanup import FINALIZER, RELEASE_ANNOTATION
from pg_operator.backup.store_ownership import (
    MARKER_NAME,
    REASON_OWNED_ELSEWHERE,
    Owner,
    marker_body,
    owner_of,
)

BUCKET = "it-backups"
# The backup kinds exist before the operator starts (it resolves its resources once, at start).
OPERATOR = OperatorSpec("backups", ("--resync-seconds", "30"),
                        crds=("deploy/crd/backups.yaml", "deploy/crd/scheduledbackups.yaml"),
                        log_must_not_contain=("Traceback",))  # fmt: skip


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def secret(namespace: str, s3: S3Server, cluster: str, *, secret_key: str | None = None) -> dict[str, Any]:
    """The credentials Secret, labelled for the one cluster of the test's namespace that uses it."""
    return s3_credentials_secret("s3-creds", namespace, s3.access_key_id, secret_key or s3.secret_access_key,
                                 cluster=cluster)  # fmt: skip


def backup_spec(endpoint: str, on_delete: str) -> dict[str, Any]:
    s3 = {"endpointURL": endpoint, "bucket": BUCKET, "path": "it", "credentials": {"secretName": "s3-creds"}}
    return {"s3": s3, "onDelete": on_delete}


def put_objects(s3: S3Server, cluster: str) -> list[str]:
    keys = [
        f"it/{cluster}/base/20261201T080000/data.tar.gz",
        f"it/{cluster}/wals/0000000100000000/000000010000000000000001.gz",
    ]
    for key in keys:
        s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"x" * 100)
    return keys


def cluster_obj(kube: Any, namespace: str, name: str) -> Any:
    return get_or_none(kube, "postgresclusters.db.example.com", name, "-n", namespace)


def finalizers(kube: Any, namespace: str, name: str) -> list[str]:
    obj = cluster_obj(kube, namespace, name)
    return list(((obj or {}).get("metadata") or {}).get("finalizers") or [])


# --- ScheduledBackup → Backups ----------------------------------------------------------------------


def test_scheduled_backup_creates_backups_on_its_schedule(
    operator: OperatorProcess, operator_env: OperatorEnv
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "sched")
    apply(kube, scheduled_backup("every-minute", ns, "nosuch", "* * * * *", immediate=True))
    sb = get_json(kube, "scheduledbackups.db.example.com", "every-minute", "-n", ns)

    def backups() -> list[dict[str, Any]]:
        return list(get_json(kube, "backups.db.example.com", "-n", ns)["items"])

    first = wait_until("the immediate Backup", lambda: backups(), 30)
    assert len(first) == 1
    b = first[0]
    assert b["metadata"]["labels"] == {
        "db.example.com/cluster": "nosuch",
        "db.example.com/scheduled-backup": "every-minute",
    }
    assert b["metadata"]["ownerReferences"][0]["uid"] == sb["metadata"]["uid"]
    assert b["spec"] == {"cluster": "nosuch"}
    # It cannot run: the cluster does not exist. It says so, and an Event says it too.
    failed = wait_until(
        "the Backup to fail",
        lambda: (
            (
                get_json(kube, "backups.db.example.com", b["metadata"]["name"], "-n", ns).get("status") or {}
            ).get("phase")
            == "Failed"
        ),
        30,
    )
    assert failed
    status = get_json(kube, "backups.db.example.com", b["metadata"]["name"], "-n", ns)["status"]
    assert status["error"].startswith("ClusterNotFound: ") and status["stoppedAt"]
    assert any(e["reason"] == "ClusterNotFound" for e in events(kube, ns, "Backup", b["metadata"]["name"]))
    sb_status = get_json(kube, "scheduledbackups.db.example.com", "every-minute", "-n", ns)["status"]
    # This one, or the next whole minute's when the immediate Backup came seconds before it.
    assert sb_status["lastBackupName"] >= b["metadata"]["name"]
    assert sb_status["lastBackupName"] in {x["metadata"]["name"] for x in backups()}
    assert sb_status["nextScheduleTime"] > sb_status["lastScheduleTime"]
    # The next minute's run.
    second = wait_until(
        "the scheduled Backup of the next minute", lambda: len(backups()) >= 2 and backups(), 75
    )
    names = sorted(x["metadata"]["name"] for x in second)
    assert len(names) == 2 and names[1].endswith("00"), names  # named after a whole minute
    # Suspended: no more.
    kube.kubectl("patch", "scheduledbackups.db.example.com", "every-minute", "-n", ns, "--type=merge",
                 "-p", json.dumps({"spec": {"suspend": True}}))  # fmt: skip
    time.sleep(max(0.0, 62 - time.time() % 60))  # past the next whole minute
    assert len(backups()) == 2
    kube.kubectl("delete", "namespace", ns, "--wait=false")


# --- who owns the store prefix, asked on events --------------------------------------------------------


def store_requests(s3: S3Server, name: str) -> int:
    """Requests moto logged for one cluster's prefix (its marker read or written, its prefix listed)."""
    listed, named = f"it%2F{name}%2F".encode(), f"/it/{name}/".encode()
    with s3.log.open("rb") as f:
        return sum(1 for line in f if b'HTTP/1.1"' in line and (listed in line or named in line))


def test_ownership_is_asked_of_the_store_on_events_never_by_a_steady_cluster(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "owned")
    name = "steady-db"
    apply(kube, secret(ns, s3, name))
    apply(kube, cluster(name, ns, replicas=1, backup=backup_spec(s3.endpoint, "keep")))
    marker = f"it/{name}/{MARKER_NAME}"
    wait_until("the cluster to claim its empty prefix", lambda: marker in s3.keys(BUCKET, f"it/{name}/"), 60)
    claimed = store_requests(s3, name)
    assert claimed >= 2, claimed  # the prefix inspected, the marker created (and read back)

    # Steady: the cluster's backup pass comes every 30 s (and on every change of its pods or status);
    # none of them asks the store again. (On kwok no pod can be exec'd into, so the archiving probe
    # fails and the pass comes back: it would ask if a kept verdict were not trusted.)
    time.sleep(75)
    assert store_requests(s3, name) == claimed

    # A change of spec.backup: the prefix is inspected again, and found its own (no second claim).
    kube.kubectl("patch", "postgrescluster", name, "-n", ns, "--type=merge",
                 "-p", json.dumps({"spec": {"backup": {"archiveTimeout": "120s"}}}))  # fmt: skip
    wait_until("the store asked after the spec change", lambda: store_requests(s3, name) > claimed, 60)
    time.sleep(5)
    changed = store_requests(s3, name)
    reasons = [e["reason"] for e in events(kube, ns, "PostgresCluster", name)]
    assert reasons.count("StorePrefixClaimed") == 1, reasons

    # Another cluster's marker put in place of ours by hand: the kept verdict does not see it, but a
    # Backup asks the store afresh before it writes anything, and is refused; the cluster's archiving
    # condition follows (a verdict that is not "ours" is never kept).
    other = Owner("elsewhere", name, "uid-elsewhere")
    s3.client().put_object(Bucket=BUCKET, Key=marker, Body=marker_body(other, how="claimed",
                                                                       now=datetime.now(UTC)))  # fmt: skip
    time.sleep(35)
    assert store_requests(s3, name) == changed + 1  # only the test's own write
    # A Backup runs on a ready instance whose role Patroni labelled; kwok runs no Patroni, so the test
    # labels the pod as Patroni would.
    pod = f"{name}-0"
    wait_until("the instance pod", lambda: get_or_none(kube, "pod", pod, "-n", ns), 60)
    kube.kubectl("label", "pod", pod, "-n", ns, f"{ROLE_LABEL}=primary", "--overwrite")
    apply(kube, backup("steady-1", ns, name))

    def backup_status() -> dict[str, Any]:
        return dict(get_json(kube, "backups.db.example.com", "steady-1", "-n", ns).get("status") or {})

    wait_until("the Backup to be refused", lambda: backup_status().get("phase") == "Failed", 60)
    assert backup_status()["error"].startswith(f"{REASON_OWNED_ELSEWHERE}: "), backup_status()
    assert "elsewhere/steady-db" in backup_status()["error"]

    def archiving() -> dict[str, Any]:
        return condition(cluster_obj(kube, ns, name), "ContinuousArchiving")

    wait_until("the archiving condition to say the prefix is another's",
               lambda: archiving().get("reason") == REASON_OWNED_ELSEWHERE, 60)  # fmt: skip
    assert archiving()["status"] == "False"
    assert "Traceback" not in operator.log_text()
    kube.kubectl("delete", "namespace", ns, "--wait=false")


# --- the object-store finalizer ---------------------------------------------------------------------


def test_on_delete_delete_empties_the_prefix_and_releases_the_finalizer(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "ondel")
    apply(kube, secret(ns, s3, "gone-db"))
    apply(kube, cluster("gone-db", ns, replicas=1, backup=backup_spec(s3.endpoint, "delete")))
    mine = put_objects(s3, "gone-db")
    # The prefix is this cluster's as its first archived segment would have claimed it (on kwok nothing
    # archives): only then may the finalizer empty it (backup/store_ownership.py).
    owner = owner_of(cluster_obj(kube, ns, "gone-db"))
    marker = f"it/gone-db/{MARKER_NAME}"
    body = marker_body(owner, how="claimed", now=datetime.now(UTC))
    s3.client().put_object(Bucket=BUCKET, Key=marker, Body=body)
    mine.append(marker)
    others = [*put_objects(s3, "other-db"), "it/gone-db-2/base/x"]
    s3.client().put_object(Bucket=BUCKET, Key=others[-1], Body=b"y")
    wait_until("the finalizer", lambda: FINALIZER in finalizers(kube, ns, "gone-db"), 30)
    wait_until("the StatefulSet", lambda: get_or_none(kube, "statefulset", "gone-db", "-n", ns), 30)
    assert set(mine) <= set(s3.keys(BUCKET))
    kube.kubectl("delete", "postgrescluster", "gone-db", "-n", ns, "--wait=false")
    wait_until("the cluster to be gone", lambda: cluster_obj(kube, ns, "gone-db") is None, 120)
    keys = s3.keys(BUCKET)
    assert not [k for k in keys if k.startswith("it/gone-db/")], keys
    assert set(others) <= set(keys)  # another cluster's objects, and a longer name sharing the prefix
    reasons = [e["reason"] for e in events(kube, ns, "PostgresCluster", "gone-db")]
    assert "BackupStoreDeleted" in reasons, reasons
    assert "Traceback" not in operator.log_text()
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_on_delete_delete_leaves_a_prefix_it_does_not_own_and_still_lets_the_cluster_go(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server
) -> None:
    """Objects under the cluster's prefix but no marker of its own (an earlier cluster of the same name, or
    one in another namespace): nothing is deleted, and the deletion is not held."""
    kube = operator_env.kube
    ns = make_namespace(kube, "alien")
    apply(kube, secret(ns, s3, "alien-db"))
    apply(kube, cluster("alien-db", ns, replicas=1, backup=backup_spec(s3.endpoint, "delete")))
    theirs = put_objects(s3, "alien-db")
    wait_until("the finalizer", lambda: FINALIZER in finalizers(kube, ns, "alien-db"), 30)
    kube.kubectl("delete", "postgrescluster", "alien-db", "-n", ns, "--wait=false")
    wait_until("the cluster to be gone", lambda: cluster_obj(kube, ns, "alien-db") is None, 120)
    assert set(theirs) <= set(s3.keys(BUCKET))
    reasons = [e["reason"] for e in events(kube, ns, "PostgresCluster", "alien-db")]
    assert "StorePrefixNotOurs" in reasons and "BackupStoreDeleted" not in reasons, reasons
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_on_delete_keep_leaves_the_store_alone(
    operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "onkeep")
    apply(kube, secret(ns, s3, "kept-db"))
    apply(kube, cluster("kept-db", ns, replicas=1, backup=backup_spec(s3.endpoint, "keep")))
    mine = put_objects(s3, "kept-db")
    wait_until("the StatefulSet", lambda: get_or_none(kube, "statefulset", "kept-db", "-n", ns), 30)
    time.sleep(3)  # a few backup passes
    assert FINALIZER not in finalizers(kube, ns, "kept-db")
    kube.kubectl("delete", "postgrescluster", "kept-db", "-n", ns, "--wait=false")
    wait_until("the cluster to be gone", lambda: cluster_obj(kube, ns, "kept-db") is None, 60)
    assert set(mine) <= set(s3.keys(BUCKET))
    kube.kubectl("delete", "namespace", ns, "--wait=false")


@pytest.mark.parametrize("case", ["unreachable", "bad-credentials"])
def test_a_failing_store_is_reported_retried_and_can_be_released_by_hand(
    case: str, operator: OperatorProcess, operator_env: OperatorEnv, s3: S3Server
) -> None:
    kube = operator_env.kube
    ns = make_namespace(kube, "onfail")
    endpoint = f"http://127.0.0.1:{free_port()}" if case == "unreachable" else s3.endpoint
    wrong = "wrong-secret-key" if case == "bad-credentials" else None
    apply(kube, secret(ns, s3, "stuck-db", secret_key=wrong))
    apply(kube, cluster("stuck-db", ns, replicas=1, backup=backup_spec(endpoint, "delete")))
    mine = put_objects(s3, "stuck-db")
    wait_until("the finalizer", lambda: FINALIZER in finalizers(kube, ns, "stuck-db"), 30)
    kube.kubectl("delete", "postgrescluster", "stuck-db", "-n", ns, "--wait=false")
    reason = "EndpointUnreachable" if case == "unreachable" else "InvalidCredentials"

    def reported() -> Any:
        cond = condition(cluster_obj(kube, ns, "stuck-db"), "BackupStoreCleanup")
        return cond if cond.get("reason") == reason else None

    cond = wait_until(f"BackupStoreCleanup False/{reason}", reported, 90)
    assert cond["status"] == "False" and RELEASE_ANNOTATION in cond["message"]
    assert "wrong-secret-key" not in json.dumps(cluster_obj(kube, ns, "stuck-db"))
    warned = [e for e in events(kube, ns, "PostgresCluster", "stuck-db") if e["type"] == "Warning"]
    assert any(reason in e["reason"] for e in warned), [e["reason"] for e in warned]
    assert all("wrong-secret-key" not in e["message"] for e in warned)
    assert FINALIZER in finalizers(kube, ns, "stuck-db")  # held while the store cannot be emptied
    kube.kubectl("annotate", "postgrescluster", "stuck-db", "-n", ns, f"{RELEASE_ANNOTATION}=true")
    wait_until("the cluster to be gone", lambda: cluster_obj(kube, ns, "stuck-db") is None, 60)
    assert set(mine) <= set(s3.keys(BUCKET))  # released by hand: the store is left as it was
    assert "wrong-secret-key" not in operator.log_text()
    kube.kubectl("delete", "namespace", ns, "--wait=false")
