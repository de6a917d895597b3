"""Losing the primary's node, on three real nodes, under a writer in synchronous mode (one synchronous
standby required), with one three-instance cluster for both tests:

- a partition (the node's link cut, its processes alive): a replica takes the leader key, the isolated
  primary stops taking writes by itself (it cannot renew its key in the API server, and failsafe mode
  keeps a primary only while it reaches every member: it reaches none), the operator reports the
  instance NodeLost once the node is Unknown, and after `heal` the old primary rejoins as a replica; every
  acknowledged write is on the winner;
- a power-off: writes resume on a replica, nothing acknowledged is lost, the operator reports NodeLost
  and, its volume being node-local, replaces the instance on one of the two remaining nodes after
  spec.nodeLoss.after (a new volume cloned from the primary), back to 3/3 ready; the pooler, two pods kept
  apart, is back to 2/2 on live nodes pointing at the new primary (its pods leave a lost node after 30 s);
  when the node comes back nothing splits (the old pod is gone from the API, the kubelet kills its
  containers).

The measured times are printed as JSON lines; their goals live in bench/bench_failover.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from localkube import topology

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.objects import cluster
from harness.paths import LOCALKUBE
from harness.pgcluster import SMALL, healthy, secret, sql_in_netns, status
from harness.rw_endpoints import EndpointWriter, rw_addresses
from harness.waiting import wait_until

NS, NAME = "node-loss", "nl-db"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 5, 5
# Long while the partition test runs (it heals well before), short for the power-off.
PARTITION_AFTER, POWEROFF_AFTER = "10m", "20s"


def node_verb(*args: str) -> None:
    res = subprocess.run([sys.executable, str(LOCALKUBE / "cluster.py"), *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, f"localkube {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}"


@pytest.fixture(scope="module")
def layout(nodes_operator: Kube) -> list[topology.NodeSpec]:
    return topology.load_layout(nodes_operator.ctx)


@pytest.fixture(scope="module")
def db(nodes_operator: Kube, layout: list[topology.NodeSpec]) -> Iterator[Kube]:
    kube = nodes_operator
    kube.kubectl("create", "namespace", NS)
    # The host (outside every node) and each node's own address on its pod bridge may connect: the
    # writer runs on the host, the isolated primary is checked from inside its node.
    peers = [{"ipBlock": {"cidr": f"{topology.HOST_NODE_IP}/32"}}]
    peers += [{"ipBlock": {"cidr": f"{n.pod_gateway}/32"}} for n in layout]
    body = cluster(NAME, NS, **{
        "replicas": 3, "resources": SMALL,
        "synchronous": {"number": 1, "dataDurability": "required"},
        "patroni": {"ttl": TTL, "loopWait": LOOP_WAIT, "retryTimeout": RETRY_TIMEOUT},
        # Sharing a node is allowed: after a node is lost, three instances must fit on two.
        "affinity": {"podAntiAffinity": "preferred"},
        "networkPolicy": {"allowFrom": peers},
        "nodeLoss": {"after": PARTITION_AFTER},
        "pooler": {"instances": 2},
    })  # fmt: skip
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    wait_until("the cluster to be healthy", lambda: healthy(kube, NS, NAME, 3), 900, 2)
    wait_until("the -rw Service to route", lambda: rw_addresses(kube, NS, NAME), 120, 1)
    yield kube
    kube.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")


def pods(kube: Kube) -> dict[str, dict[str, Any]]:
    items = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={NAME}")["items"]
    return {p["metadata"]["name"]: p for p in items}


def leader(kube: Kube) -> str:
    meta = get_json(kube, "configmap", f"{NAME}-leader", "-n", NS)["metadata"]
    return str((meta.get("annotations") or {}).get("leader") or "")


def voters_recorded(kube: Kube) -> dict[str, Any] | None:
    """The status once Patroni's -sync key names the primary and every other instance as its quorum
    voters: until then strict synchronous mode promotes nobody (cutting the primary off right after the
    cluster became healthy would only show that)."""
    st = healthy(kube, NS, NAME, 3)
    if st is None:
        return None
    meta = get_json(kube, "configmap", f"{NAME}-sync", "-n", NS)["metadata"]
    annotations = meta.get("annotations") or {}
    voters = {v.strip() for v in str(annotations.get("sync_standby") or "").split(",") if v.strip()}
    others = {i["name"] for i in st["instances"]} - {st["currentPrimary"]}
    return st if annotations.get("leader") == st["currentPrimary"] and voters == others else None


def new_leader(kube: Kube, old: str) -> str:
    """The leader key's holder once it is another instance than `old`, else ''."""
    holder = leader(kube)
    return holder if holder != old else ""


def node_lost_condition(kube: Kube) -> str:
    """The Degraded condition's message while its reason is NodeLost, else ''."""
    for c in status(kube, NS, NAME).get("conditions") or []:
        if c["type"] == "Degraded" and c["status"] == "True" and c.get("reason") == "NodeLost":
            return str(c.get("message") or "")
    return ""


def events(kube: Kube, reason: str) -> list[str]:
    items = get_json(kube, "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")["items"]
    return [e.get("message", "") for e in items if e.get("reason") == reason]


def pooler_back(kube: Kube, lost_node: str, primary: str) -> dict[str, str] | None:
    """The pooler's ready pods and their nodes once two are ready off the lost node and the cluster's
    Pooler condition says they point at `primary`, else None."""
    items = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/pooler={NAME}")["items"]
    ready = {
        p["metadata"]["name"]: str(p["spec"].get("nodeName"))
        for p in items
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    }
    conditions = {c["type"]: c for c in status(kube, NS, NAME).get("conditions") or []}
    pooler = conditions.get("Pooler") or {}
    pointing = pooler.get("status") == "True" and f"pointing at {primary}" in str(pooler.get("message"))
    placed = [n for n in ready.values() if n != lost_node]
    return ready if len(placed) >= 2 and pointing else None


def find(layout: list[topology.NodeSpec], name: str) -> topology.NodeSpec:
    return topology.find_node(layout, name)


def test_a_partitioned_primary_stops_taking_writes_and_rejoins_after_heal(
    db: Kube, layout: list[topology.NodeSpec]
) -> None:
    st = wait_until("healthy, with both replicas quorum voters", lambda: voters_recorded(db), 300, 1)
    old = st["currentPrimary"]
    node = find(layout, pods(db)[old]["spec"]["nodeName"])
    pod_ip = pods(db)[old]["status"]["podIP"]
    app = secret(db, NS, f"{NAME}-app")
    dsn = (f"host={pod_ip} port={app['port']} user={app['username']} password={app['password']} "
           f"dbname={app['dbname']}")  # fmt: skip
    inside = f"/run/netns/{node.netns}"  # the old primary's own node: it still reaches its pods
    figures: dict[str, Any] = {"measure": "node_partition", "ttl": TTL, "old_primary": old, "node": node.name,
                               "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip
    with EndpointWriter(db, NS, NAME, "partition_writes") as writer:
        writer.wait_for_writes(20, 60)
        cut = time.monotonic()
        node_verb("partition", node.name)
        try:
            promoted = wait_until("a replica to take the leader key", lambda: new_leader(db, old), 180, 0.5)
            figures.update(new_primary=promoted, promoted_after_s=round(time.monotonic() - cut, 1))

            def stopped() -> str:
                """What the isolated primary answers from inside its node: '' while it is a primary."""
                try:
                    in_recovery = sql_in_netns(inside, dsn, "select pg_is_in_recovery()")
                except subprocess.CalledProcessError as exc:
                    return "" if "timeout" in exc.stderr else "stopped"
                return "read-only" if in_recovery == "True" else ""

            figures["old_primary_state"] = wait_until("the isolated primary to stop taking writes", stopped,
                                                      120, 0.5)  # fmt: skip
            figures["old_primary_stopped_after_s"] = round(time.monotonic() - cut, 1)
            with pytest.raises(subprocess.CalledProcessError):
                sql_in_netns(inside, dsn, "insert into partition_writes (id) values (-1) returning id")
            writer.wait_for_writes(20, 120)  # writes resume on the new primary while the node is cut off
            message = wait_until("the operator to report the instance NodeLost",
                                 lambda: node_lost_condition(db), 180, 1)  # fmt: skip
            figures["node_lost_reported_after_s"] = round(time.monotonic() - cut, 1)
            assert f"instance {old} is on node {node.name}" in message, message
            assert old in pods(db), "the instance was replaced during a partition shorter than nodeLoss.after"
        finally:
            node_verb("heal", node.name)
        healed = time.monotonic()

        def rejoined() -> bool:
            instances = {i["name"]: i for i in (healthy(db, NS, NAME, 3) or {}).get("instances", [])}
            return bool(instances) and instances[old]["role"] == "replica" and \
                instances[old].get("timeline") == instances[promoted].get("timeline")  # fmt: skip

        wait_until(f"{old} to rejoin as a replica on the new timeline", rejoined, 300, 1)
        figures["rejoined_after_heal_s"] = round(time.monotonic() - healed, 1)
        writer.wait_for_writes(10, 60)
    lost = writer.missing()
    figures.update(write_gap_s=round(writer.longest_outage, 2), acknowledged=len(writer.acked),
                   acknowledged_lost=len(lost))  # fmt: skip
    print(json.dumps(figures), flush=True)
    assert lost == [], f"acknowledged writes missing on the winner: {lost[:10]}"
    assert events(db, "NodeLost"), "no Warning Event named the lost node"
    wait_until("NodeLost to clear", lambda: not node_lost_condition(db), 120, 1)


def test_a_powered_off_primary_node_fails_over_and_its_instance_is_replaced_elsewhere(
    db: Kube, layout: list[topology.NodeSpec]
) -> None:
    st = wait_until("healthy, with both replicas quorum voters", lambda: voters_recorded(db), 300, 1)
    old = st["currentPrimary"]
    before = pods(db)
    node = find(layout, before[old]["spec"]["nodeName"])
    old_uid = before[old]["metadata"]["uid"]
    old_claim = get_json(db, "pvc", f"data-{old}", "-n", NS)["metadata"]["uid"]
    db.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p",
               json.dumps({"spec": {"nodeLoss": {"after": POWEROFF_AFTER}}}))  # fmt: skip
    figures: dict[str, Any] = {"measure": "node_poweroff", "ttl": TTL, "after": POWEROFF_AFTER,
                               "old_primary": old, "node": node.name,
                               "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip
    try:
        with EndpointWriter(db, NS, NAME, "poweroff_writes") as writer:
            writer.wait_for_writes(20, 60)
            off = time.monotonic()
            node_verb("poweroff", node.name)
            promoted = wait_until("a replica to take the leader key", lambda: new_leader(db, old), 180, 0.5)
            figures.update(new_primary=promoted, promoted_after_s=round(time.monotonic() - off, 1))
            writer.wait_for_writes(20, 120)
            figures["writes_resumed_after_s"] = round(time.monotonic() - off, 1)
            message = wait_until("the operator to report the instance NodeLost",
                                 lambda: node_lost_condition(db), 180, 1)  # fmt: skip
            figures["node_lost_reported_after_s"] = round(time.monotonic() - off, 1)
            assert f"instance {old} is on node {node.name}" in message, message

            def replaced() -> bool:
                pod = pods(db).get(old)
                return pod is not None and pod["metadata"]["uid"] != old_uid

            wait_until(f"{old} to be replaced", replaced, 300, 1)
            figures["replaced_after_s"] = round(time.monotonic() - off, 1)

            def back() -> dict[str, Any] | None:
                st = healthy(db, NS, NAME, 3)
                placed = {p["spec"].get("nodeName") for p in pods(db).values()}
                return st if st is not None and node.name not in placed else None

            wait_until("3/3 ready on the remaining nodes", back, 600, 2)
            figures["three_ready_after_s"] = round(time.monotonic() - off, 1)
            pooled = wait_until("the pooler 2/2 on live nodes, pointing at the new primary",
                                lambda: pooler_back(db, node.name, promoted), 300, 2)  # fmt: skip
            figures["pooler_back_after_s"] = round(time.monotonic() - off, 1)
            assert node.name not in pooled.values(), pooled
            writer.wait_for_writes(10, 60)
        lost = writer.missing()
        figures.update(write_gap_s=round(writer.longest_outage, 2), acknowledged=len(writer.acked),
                       acknowledged_lost=len(lost))  # fmt: skip
        new_claim = get_json(db, "pvc", f"data-{old}", "-n", NS)
        assert new_claim["metadata"]["uid"] != old_claim, "the instance kept its node-local claim"
        replaced_events = events(db, "InstanceReplaced")
        assert replaced_events and old in replaced_events[-1], replaced_events
    finally:
        node_verb("poweron", node.name)
    print(json.dumps(figures), flush=True)
    assert lost == [], f"acknowledged writes lost: {lost[:10]}"
    # The node is back: nothing splits. The old pod is gone from the API, so its kubelet does not start
    # it again; the primary stays where it went, the three instances where they run.
    time.sleep(15)
    st = wait_until("healthy after the node returned", lambda: healthy(db, NS, NAME, 3), 300, 2)
    assert st["currentPrimary"] == promoted
    assert node.name not in {p["spec"].get("nodeName") for p in pods(db).values()}
    wait_until("NodeLost to clear", lambda: not node_lost_condition(db), 120, 1)
