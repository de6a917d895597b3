"""Hibernation and fencing on real pods (full profile), on one cluster of three instances archiving to the
module's store:

- hibernate: every pod gone after PostgreSQL stopped replicas first and the primary last, the volumes,
  Secrets and Services kept, `Hibernated`, and a ScheduledBackup due every minute creating no Backup (so no
  Job); wake: the same primary leads, every row is there, Ready, and the schedule resumes;
- fence a replica: its pod keeps running and answers `kubectl exec`, PostgreSQL does not run there, its
  data directory does not change while fenced, the primary takes writes;
- fence the primary: a switchover first, writes go on through -rw on the new primary; unfence: three
  instances, two replicas streaming again, every row there.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from harness.e2e_backup import Moto, backup_cluster, credentials, s3, status_condition, superuser_sql
from harness.kube import apply_objects, events_for, get_json, get_or_none
from harness.local_cluster import Kube
from harness.objects import scheduled_backup
from harness.pgcluster import connect_app, status, wait_serving
from harness.waiting import wait_until
from pg_operator.api.constants import FENCED_ANNOTATION, POSTGRES_STOPPED_ANNOTATION

NAME = "life-db"
SCHEDULE = "life-every-minute"
PGDATA = "/var/lib/postgresql/data/pgdata"


@pytest.fixture(scope="module")
def life(operator: Kube, ns: str, moto: Moto) -> Kube:
    store = {"s3": s3(moto, NAME), "onDelete": "delete"}
    apply_objects(operator, credentials(moto, ns, NAME), backup_cluster(NAME, ns, 3, backup=store))
    wait_serving(operator, ns, NAME, 3, 900)
    with connect_app(operator, ns, NAME) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY)")
        conn.execute("INSERT INTO items SELECT generate_series(1, 100)")
    return operator


def patch(kube: Kube, ns: str, spec: dict[str, Any]) -> None:
    kube.kubectl("patch", "pgc", NAME, "-n", ns, "--type=merge", "-p", json.dumps({"spec": spec}))


def ids(kube: Kube, ns: str) -> list[int]:
    with connect_app(kube, ns, NAME) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM items ORDER BY id").fetchall()]


def insert(kube: Kube, ns: str, first: int, last: int) -> None:
    """Through -rw, retried while the Service moves to a new primary (ON CONFLICT: a retry after a commit
    whose answer was lost adds nothing twice)."""

    def write() -> bool:
        with connect_app(kube, ns, NAME) as conn:
            conn.execute(
                "INSERT INTO items SELECT generate_series(%s::int, %s::int) ON CONFLICT DO NOTHING",
                (first, last),
            )
        return True

    wait_until(f"rows {first}-{last} written through {NAME}-rw", write, 60, 1)


def uids(kube: Kube, ns: str, kind: str) -> dict[str, str]:
    items = get_json(kube, kind, "-n", ns, "-l", f"db.example.com/cluster={NAME}")["items"]
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}


def pod(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return dict(get_json(kube, "pod", name, "-n", ns))


def ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])


def restarts(p: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in p["status"].get("containerStatuses") or [])


def in_pod(kube: Kube, ns: str, name: str, command: str) -> tuple[int, str]:
    done = kube.kubectl("exec", name, "-n", ns, "-c", "postgres", "--", "sh", "-c", command, check=False)
    return done.returncode, (done.stdout + done.stderr).strip()


def reasons(kube: Kube, ns: str) -> list[str]:
    return [str(e.get("reason")) for e in events_for(kube, ns, NAME)]


def backups_of_schedule(kube: Kube, ns: str) -> list[str]:
    items = get_json(kube, "backups.db.example.com", "-n", ns)["items"]
    return [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith(SCHEDULE)]


def test_hibernation_stops_every_pod_keeps_the_data_and_wakes_with_the_same_primary(
    life: Kube, ns: str
) -> None:
    primary = str(status(life, ns, NAME)["currentPrimary"])
    claims, secrets = uids(life, ns, "pvc"), uids(life, ns, "secret")
    services = uids(life, ns, "service")
    assert len(claims) == 3 and secrets and services

    patch(life, ns, {"hibernation": True})
    phases: list[str] = []

    def hibernated() -> bool:
        st = status(life, ns, NAME)
        phase = str((st.get("hibernation") or {}).get("phase") or "")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        pods = get_json(life, "pods", "-n", ns, "-l", f"db.example.com/cluster={NAME}")["items"]
        return st.get("phase") == "Hibernated" and not pods

    wait_until(f"{NAME} to hibernate with no pod left", hibernated, 300, 1)
    st = status(life, ns, NAME)
    assert st["hibernation"] == {"phase": "Hibernated", "primary": primary}
    assert status_condition(life, ns, NAME, "Hibernated")["status"] == "True"
    assert status_condition(life, ns, NAME, "Ready")["reason"] == "Hibernated"
    assert status_condition(life, ns, NAME, "Degraded")["status"] == "False"
    # Replicas stopped before the primary: the phases seen come in that order (one seen only in passing
    # may be missed by the poll), and the Events say both steps.
    assert phases == [p for p in ("StoppingReplicas", "StoppingPrimary", "Hibernated") if p in phases]
    told = [str(e.get("message")) for e in events_for(life, ns, NAME) if e.get("reason") == "Hibernating"]
    assert any("stopping the replicas" in m for m in told) and any("stopping the primary" in m for m in told)
    assert get_json(life, "statefulset", NAME, "-n", ns)["spec"]["replicas"] == 0
    assert uids(life, ns, "pvc") == claims and uids(life, ns, "secret") == secrets
    assert uids(life, ns, "service") == services
    assert "Hibernated" in reasons(life, ns) and "PrimaryChanged" not in reasons(life, ns)

    # A schedule due every minute creates no Backup (so no Job) while the cluster sleeps; it still looks.
    apply_objects(life, scheduled_backup(SCHEDULE, ns, NAME, "* * * * *"))

    def next_time() -> str:
        return str(
            get_json(life, "scheduledbackup", SCHEDULE, "-n", ns).get("status", {}).get("nextScheduleTime")
        )

    wait_until("the ScheduledBackup to be looked at", lambda: next_time() != "None", 60, 1)
    first_look = next_time()
    time.sleep(75)  # past at least one scheduled minute
    assert next_time() != first_look  # the schedule came due while the cluster hibernated ...
    assert backups_of_schedule(life, ns) == []  # ... and made nothing
    assert get_json(life, "jobs", "-n", ns)["items"] == []

    patch(life, ns, {"hibernation": False})
    st = wait_serving(life, ns, NAME, 3, 600)
    assert st["currentPrimary"] == primary
    assert ids(life, ns) == list(range(1, 101))
    assert status_condition(life, ns, NAME, "Ready")["status"] == "True"
    assert "hibernation" not in status(life, ns, NAME)
    assert {"Waking", "Awake"} <= set(reasons(life, ns))

    # The schedule resumes: one Backup for the runs missed while asleep.
    made = wait_until("the schedule to resume", lambda: backups_of_schedule(life, ns), 180, 3)
    # Suspended (not deleted: its Backups are its children and would go with it) until that one is done.
    life.kubectl(
        "patch", "scheduledbackup", SCHEDULE, "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )

    def finished() -> bool:
        found = get_or_none(life, "backups.db.example.com", made[0], "-n", ns) or {}
        return found.get("status", {}).get("phase") in ("Completed", "Failed")

    wait_until(f"Backup {made[0]} to finish", finished, 300, 3)
    life.kubectl("delete", "scheduledbackup", SCHEDULE, "-n", ns)


def test_a_fenced_replica_keeps_its_pod_and_its_data_without_postgresql(life: Kube, ns: str) -> None:
    primary = str(status(life, ns, NAME)["currentPrimary"])
    replica = next(n for n in (f"{NAME}-{i}" for i in range(3)) if n != primary)
    restarts_before = restarts(pod(life, ns, replica))
    patch(life, ns, {"fencedInstances": [replica]})

    def fenced() -> bool:
        p = pod(life, ns, replica)
        annotations = p["metadata"].get("annotations") or {}
        return (status(life, ns, NAME).get("fencedInstances") == [replica] and not ready(p)
                and bool(annotations.get(POSTGRES_STOPPED_ANNOTATION)))  # fmt: skip

    wait_until(f"{replica} to be fenced", fenced, 120, 1)
    p = pod(life, ns, replica)
    assert p["status"]["phase"] == "Running" and restarts(p) == restarts_before
    assert (p["metadata"].get("annotations") or {}).get(FENCED_ANNOTATION) == "true"
    code, said = in_pod(life, ns, replica, f"pg_ctl status -D {PGDATA}")
    assert code == 3 and "no server running" in said  # kubectl exec works; PostgreSQL does not run
    assert status_condition(life, ns, NAME, "Fenced")["status"] == "True"
    assert status_condition(life, ns, NAME, "Degraded")["reason"] == "Fenced"

    look = f"stat -c %Y {PGDATA}/global/pg_control && md5sum {PGDATA}/global/pg_control && ls {PGDATA}/pg_wal"
    _, before = in_pod(life, ns, replica, look)
    insert(life, ns, 101, 200)  # the primary takes writes; the fenced replica receives none
    time.sleep(20)  # two kubelet probe periods and more: nothing may touch the data meanwhile
    _, after = in_pod(life, ns, replica, look)
    assert after == before
    assert restarts(pod(life, ns, replica)) == restarts_before  # liveness held without Patroni


def test_a_fenced_primary_hands_over_and_unfencing_rejoins_every_instance(life: Kube, ns: str) -> None:
    old = str(status(life, ns, NAME)["currentPrimary"])
    patch(life, ns, {"fencedInstances": [old]})  # the replica fenced before is unfenced at the same time

    def moved() -> str | None:
        st = status(life, ns, NAME)
        new = str(st.get("currentPrimary") or "")
        return new if new and new != old and st.get("fencedInstances") == [old] else None

    new = wait_until(f"{old} to hand over and stop", moved, 180, 1)
    assert "Switchover" in reasons(life, ns)
    insert(life, ns, 201, 300)  # through -rw, on the new primary
    code, said = in_pod(life, ns, old, f"pg_ctl status -D {PGDATA}")
    assert code == 3 and "no server running" in said

    life.kubectl("patch", "pgc", NAME, "-n", ns, "--type=json",
                 "-p", json.dumps([{"op": "remove", "path": "/spec/fencedInstances"}]))  # fmt: skip
    st = wait_serving(life, ns, NAME, 3, 300)
    assert st["currentPrimary"] == new and "fencedInstances" not in st
    assert status_condition(life, ns, NAME, "Fenced") == {}

    def streaming() -> bool:
        query = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
        return superuser_sql(life, ns, new, query) == "2"

    wait_until("both replicas to stream from the new primary", streaming, 120, 2)
    assert ids(life, ns) == list(range(1, 301))
