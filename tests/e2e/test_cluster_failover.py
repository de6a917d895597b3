"""Failover on real pods: the primary's container SIGKILLed, the primary's pod deleted, and a planned
switchover, each under a writer that runs throughout. With synchronous replication no acknowledged
commit may be lost. The figures printed here are measured again, over trials, by bench/bench_failover.py.
"""

from __future__ import annotations

import json
import time

import psycopg

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import (
    SYNC_NAME,
    SYNC_NAMESPACE,
    StreamHold,
    Writer,
    healthy,
    kill_container,
    pod_netns,
    secret,
    status,
)
from harness.waiting import wait_until
from pg_operator.api.constants import PATRONI_PORT

# The e2e tier's synchronous cluster (its session fixture `sync_cluster`; the settings module shares it).
NS, NAME = SYNC_NAMESPACE, SYNC_NAME


def sync_standbys(kube: Kube, primary: str) -> list[str]:
    """The synchronous standbys Patroni recorded for `primary`, its quorum voters (it may take a moment
    after a change of primary)."""

    def recorded() -> list[str]:
        meta = get_json(kube, "configmap", f"{NAME}-sync", "-n", NS)["metadata"]
        annotations = meta.get("annotations") or {}
        if annotations.get("leader") != primary:
            return []
        return sorted(n.strip() for n in str(annotations.get("sync_standby") or "").split(",") if n.strip())

    return list(wait_until("Patroni to record its synchronous standbys", recorded, 120, 1))


def events(kube: Kube, reason: str) -> list[str]:
    items = get_json(kube, "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")["items"]
    return [e.get("message", "") for e in items if e.get("reason") == reason]


def report(measure: str, writer: Writer, old: str, new: str) -> None:
    print(
        json.dumps(
            {
                "measure": measure,
                "write_outage_s": round(writer.longest_outage, 2),
                "acknowledged": len(writer.acked),
                "old_primary": old,
                "new_primary": new,
            }
        ),
        flush=True,
    )


def restarts(kube: Kube, pod: str) -> int:
    statuses = get_json(kube, "pod", pod, "-n", NS)["status"].get("containerStatuses") or []
    return int(next(c.get("restartCount", 0) for c in statuses if c["name"] == "postgres"))


def test_primary_container_killed_a_sync_standby_takes_over_and_nothing_acknowledged_is_lost(
    sync_cluster: Kube,
) -> None:
    old = wait_until("healthy", lambda: healthy(sync_cluster, NS, NAME, 3), 300)["currentPrimary"]
    standbys = sync_standbys(sync_cluster, old)
    restarts_before = restarts(sync_cluster, old)

    def handover_configured() -> bool:
        config = get_json(sync_cluster, "configmap", f"{NAME}-config", "-n", NS)["metadata"]["annotations"]
        return json.loads(config["config"]).get("primary_start_timeout") == 0

    wait_until("the operator to set primary_start_timeout 0 in Patroni's config", handover_configured, 60)
    with Writer(sync_cluster, NS, NAME, "kill_writes") as writer:
        writer.wait_for_writes(20, 60)
        kill_container(sync_cluster, NS, old)
        wait_until("writes to fail over", lambda: writer.outages, 120, 0.2)
        writer.wait_for_writes(20, 60)
    st = wait_until("healthy again", lambda: healthy(sync_cluster, NS, NAME, 3), 300)
    new = st["currentPrimary"]
    report("failover_container_sigkill", writer, old, new)
    assert writer.missing() == [], "acknowledged commits were lost"
    # However quickly the kubelet restarts the container, the crashed primary never resumes in place:
    # the operator releases its key while the container is down, or the restarted Patroni hands over
    # itself (primary_start_timeout 0, kept by the operator in Patroni's dynamic configuration).
    assert restarts(sync_cluster, old) > restarts_before, "the container was not restarted in place"
    assert new in standbys, f"{new} was promoted, not one of the synchronous standbys {standbys}"
    instances = {i["name"]: i for i in st["instances"]}
    assert instances[old]["role"] == "replica", f"the old primary did not rejoin as a replica: {instances}"

    def same_timeline() -> bool:
        timelines = {i["name"]: i.get("timeline") for i in status(sync_cluster, NS, NAME)["instances"]}
        return timelines[old] is not None and timelines[old] == timelines[new]

    wait_until("the old primary to follow the new timeline", same_timeline, 120, 1)
    assert events(sync_cluster, "PrimaryChanged"), "no Warning Event for the failover"


def test_primary_pod_deleted_a_replica_takes_over(sync_cluster: Kube) -> None:
    old = wait_until("healthy", lambda: healthy(sync_cluster, NS, NAME, 3), 300)["currentPrimary"]
    with Writer(sync_cluster, NS, NAME, "delete_writes") as writer:
        writer.wait_for_writes(20, 60)
        sync_cluster.kubectl("delete", "pod", old, "-n", NS, "--wait=false")
        wait_until("writes to fail over", lambda: writer.outages, 120, 0.2)
        writer.wait_for_writes(20, 60)
    new = wait_until("healthy again", lambda: healthy(sync_cluster, NS, NAME, 3), 300)["currentPrimary"]
    report("failover_pod_deleted", writer, old, new)
    assert new != old
    assert writer.missing() == []


def test_planned_switchover_to_a_chosen_replica(sync_cluster: Kube) -> None:
    st = wait_until("healthy", lambda: healthy(sync_cluster, NS, NAME, 3), 300)
    old = st["currentPrimary"]
    # With synchronous replication Patroni switches over only to a synchronous standby it recorded.
    target = sync_standbys(sync_cluster, old)[0]
    with Writer(sync_cluster, NS, NAME, "switchover_writes") as writer:
        writer.wait_for_writes(20, 60)
        started = time.monotonic()
        sync_cluster.kubectl("annotate", "pgc", NAME, "-n", NS, f"db.example.com/switchover-to={target}")
        wait_until(
            f"{target} to become primary",
            lambda: status(sync_cluster, NS, NAME).get("currentPrimary") == target,
            120,
            0.5,
        )
        took = time.monotonic() - started
        writer.wait_for_writes(20, 60)
    report("switchover", writer, old, target)
    print(json.dumps({"measure": "switchover_requested_to_primary_s", "seconds": round(took, 2)}))
    assert writer.missing() == []
    annotations = get_json(sync_cluster, "pgc", NAME, "-n", NS)["metadata"].get("annotations") or {}
    assert "db.example.com/switchover-to" not in annotations, "the request was not cleared once done"


def test_a_switchover_patroni_refuses_is_answered_not_retried_forever(sync_cluster: Kube) -> None:
    st = wait_until("healthy", lambda: healthy(sync_cluster, NS, NAME, 3), 300)
    primary = st["currentPrimary"]
    target = sync_standbys(sync_cluster, primary)[0]
    # The primary's Patroni cannot reach the target's REST API (its probes from the node still can):
    # Patroni refuses a switchover to a candidate it cannot check, every time it is asked.
    primary_ip = get_json(sync_cluster, "pod", primary, "-n", NS)["status"]["podIP"]
    blocked = StreamHold(pod_netns(sync_cluster, NS, target), primary_ip, PATRONI_PORT, to_this_pod=True)
    blocked.hold()
    try:
        sync_cluster.kubectl("annotate", "pgc", NAME, "-n", NS, f"db.example.com/switchover-to={target}")

        def answered() -> bool:
            annotations = get_json(sync_cluster, "pgc", NAME, "-n", NS)["metadata"].get("annotations") or {}
            return "db.example.com/switchover-to" not in annotations

        wait_until("the request to be answered", answered, 180, 1)
    finally:
        blocked.release()
    assert events(sync_cluster, "SwitchoverRefused"), "no Event says why"
    assert status(sync_cluster, NS, NAME)["currentPrimary"] == primary


def test_a_replica_that_lost_its_disk_rejoins_from_the_primary(sync_cluster: Kube) -> None:
    st = wait_until("healthy", lambda: healthy(sync_cluster, NS, NAME, 3), 300)
    primary = st["currentPrimary"]
    # With quorum commit the other voter confirms commits while this one rebuilds.
    victim = next(i["name"] for i in st["instances"] if i["role"] == "replica")
    claim = f"data-{victim}"
    old_claim = get_json(sync_cluster, "pvc", claim, "-n", NS)["metadata"]["uid"]
    old_pod = get_json(sync_cluster, "pod", victim, "-n", NS)["metadata"]["uid"]
    with Writer(sync_cluster, NS, NAME, "lost_disk_writes") as writer:
        writer.wait_for_writes(20, 60)
        # The disk is gone: its claim is deleted (the pvc-protection finalizer holds it until the pod has
        # gone), then the pod; the StatefulSet recreates both, the volume empty.
        sync_cluster.kubectl("delete", "pvc", claim, "-n", NS, "--wait=false")
        sync_cluster.kubectl("delete", "pod", victim, "-n", NS, "--wait=false")

        def rebuilt() -> bool:
            pod = get_json(sync_cluster, "pod", victim, "-n", NS)
            ready = any(
                c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or []
            )
            new_claim = get_json(sync_cluster, "pvc", claim, "-n", NS)["metadata"]["uid"]
            return ready and pod["metadata"]["uid"] != old_pod and new_claim != old_claim

        wait_until(f"{victim} back and ready on a new, empty volume", rebuilt, 600, 2)
        st = wait_until("healthy again", lambda: healthy(sync_cluster, NS, NAME, 3), 300, 2)
        writer.wait_for_writes(20, 60)
    assert st["currentPrimary"] == primary, "losing a replica's disk moved the primary"
    assert writer.missing() == []
    pod_ip = get_json(sync_cluster, "pod", victim, "-n", NS)["status"]["podIP"]
    app = secret(sync_cluster, NS, f"{NAME}-app")

    def caught_up() -> bool:
        with psycopg.connect(
            host=pod_ip,
            port=int(app["port"]),
            user=app["username"],
            password=app["password"],
            dbname=app["dbname"],
            connect_timeout=3,
        ) as conn:
            in_recovery = conn.execute("select pg_is_in_recovery()").fetchone()
            have = {r[0] for r in conn.execute("select id from lost_disk_writes").fetchall()}
        return in_recovery == (True,) and set(writer.acked) <= have

    wait_until(f"{victim}, rebuilt from the primary, to hold every acknowledged row", caught_up, 120, 1)
