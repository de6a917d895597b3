"""bench_failover.py's node kinds, on the full profile with three nodes (PGOP_FULL_NODES=3):

- `node_poweroff`: the primary's node powered off (localkube `poweroff`: link cut, every process of it
  killed). Timed: the new leader, writes resuming, the operator's NodeLost, the replacement of the lost
  instance on another node (spec.nodeLoss.after NODE_LOSS_AFTER: its volume is node-local) and 3/3 ready
  again without the node; then the node is powered on for the next trial.
- `node_partition`: the primary's node cut off (`partition`: link cut, processes alive), healed once
  writes resumed on the new primary. Timed: the new leader and the old primary back as a replica on the
  new timeline after the heal.

Each trial starts with one instance per node (`_spread`). The writers go where kube-proxy would send
them (the -rw Service's ready endpoints): the host of a multi-node profile runs no kube-proxy
(harness/rw_endpoints.py). The cluster admits the host by address (`spec_additions`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localkube import topology

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.rw_endpoints import EndpointWriter
from harness.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
NODE_KINDS = ("node_poweroff", "node_partition")
NODE_LOSS_AFTER = "20s"


def spec_additions(kinds: Sequence[str]) -> dict[str, Any]:
    """What the bench's cluster needs for the node kinds: the host admitted by the NetworkPolicy (it is
    outside every node), instances allowed to share a node once one is lost, a short replacement delay."""
    if not set(kinds) & set(NODE_KINDS):
        return {}
    return {
        "networkPolicy": {"allowFrom": [{"ipBlock": {"cidr": f"{topology.HOST_NODE_IP}/32"}}]},
        "affinity": {"podAntiAffinity": "preferred"},
        "nodeLoss": {"after": NODE_LOSS_AFTER},
    }


def node_verb(*args: str) -> None:
    res = subprocess.run([sys.executable, str(REPO / "localkube" / "cluster.py"), *args],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    if res.returncode != 0:
        raise AssertionError(f"localkube {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")


def _pods(kube: Kube, ns: str, name: str) -> dict[str, dict[str, Any]]:
    items = get_json(kube, "pods", "-n", ns, "-l", f"db.example.com/cluster={name}")["items"]
    return {p["metadata"]["name"]: p for p in items}


def _annotations(kube: Kube, ns: str, configmap: str) -> dict[str, str]:
    return dict(get_json(kube, "configmap", configmap, "-n", ns)["metadata"].get("annotations") or {})


def _steady(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    """Every instance ready on one timeline, the leader key on the reported primary, a synchronous standby
    recorded for it, and every node Ready."""
    st = dict(get_json(kube, "pgc", name, "-n", ns).get("status") or {})
    instances = st.get("instances") or []
    primary = st.get("currentPrimary")
    sync = _annotations(kube, ns, f"{name}-sync")
    if not (len(instances) == 3 and all(i.get("ready") for i in instances) and primary
            and _annotations(kube, ns, f"{name}-leader").get("leader") == primary == sync.get("leader")
            and sync.get("sync_standby") and len({i.get("timeline") for i in instances}) == 1):  # fmt: skip
        return None
    nodes = get_json(kube, "nodes")["items"]
    ready = all(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
                for n in nodes)  # fmt: skip
    return st if ready else None


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _node_lost(kube: Kube, ns: str, name: str) -> bool:
    conditions = (get_json(kube, "pgc", name, "-n", ns).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Degraded" and c.get("reason") == "NodeLost" for c in conditions)


def _spread(kube: Kube, ns: str, name: str) -> bool:
    """One instance per node again, as the first trial found them: after a `node_poweroff` trial the
    replacement shares a node with another instance (two nodes were left), and losing that node would
    take the primary and its only quorum partner at once (Patroni then promotes nobody). A replica on a
    shared node is rebuilt — claim and pod deleted, as a person would — so the scheduler (preferred
    anti-affinity) puts it on the empty node. Whether it had to."""
    pods = _pods(kube, ns, name)
    nodes = [n["metadata"]["name"] for n in get_json(kube, "nodes")["items"]]
    placed: dict[str, list[str]] = {}
    for pod_name, pod in sorted(pods.items()):
        placed.setdefault(str(pod["spec"].get("nodeName")), []).append(pod_name)
    if len(placed) >= min(len(nodes), len(pods)):
        return False
    leader = _annotations(kube, ns, f"{name}-leader").get("leader")
    shared = next(members for members in placed.values() if len(members) > 1)
    victim = next(m for m in shared if m != leader)
    uid = pods[victim]["metadata"]["uid"]
    kube.kubectl("delete", "pvc", f"data-{victim}", "-n", ns, "--wait=false")
    kube.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")

    def rebuilt() -> bool:
        pod = _pods(kube, ns, name).get(victim)
        return pod is not None and pod["metadata"]["uid"] != uid and _ready(pod)

    wait_until(f"{victim} rebuilt on the empty node", rebuilt, 600, 2)
    return True


def node_trial(kube: Kube, ns: str, name: str, how: str, table: str, load: float) -> dict[str, Any]:
    """One trial of a node kind: the row bench_failover.py summarises (its writers' outages and losses)
    plus this kind's timings."""
    wait_until("a steady cluster on every node", lambda: _steady(kube, ns, name), 900, 2)
    spread = _spread(kube, ns, name)
    st = wait_until("a steady cluster on every node", lambda: _steady(kube, ns, name), 900, 2)
    old = st["currentPrimary"]
    before = _pods(kube, ns, name)
    node = before[old]["spec"]["nodeName"]
    old_uid = before[old]["metadata"]["uid"]
    writers = {
        "fresh": EndpointWriter(kube, ns, name, table, persistent=False),
        "pooled": EndpointWriter(kube, ns, name, f"{table}_pooled"),
    }
    timings: dict[str, float] = {}

    def since(t0: float) -> float:
        return round(time.monotonic() - t0, 1)

    def new_leader() -> str:
        holder = _annotations(kube, ns, f"{name}-leader").get("leader", "")
        return holder if holder != old else ""

    verb, back = ("poweroff", "poweron") if how == "node_poweroff" else ("partition", "heal")
    with writers["fresh"], writers["pooled"]:
        for w in writers.values():
            w.wait_for_writes(20, 60)
        t0 = time.monotonic()
        node_verb(verb, node)
        try:
            new = wait_until("a new leader", new_leader, 300, 0.5)
            timings["leader_s"] = since(t0)
            for w in writers.values():
                w.wait_for_writes(10, 180)
            timings["writes_resumed_s"] = since(t0)
            if how == "node_poweroff":
                wait_until("NodeLost", lambda: _node_lost(kube, ns, name), 300, 1)
                timings["node_lost_reported_s"] = since(t0)

                def replaced() -> bool:
                    pod = _pods(kube, ns, name).get(old)
                    return pod is not None and pod["metadata"]["uid"] != old_uid

                wait_until("the lost instance to be replaced", replaced, 600, 1)
                timings["replaced_s"] = since(t0)

                def three_ready_elsewhere() -> bool:
                    pods = _pods(kube, ns, name).values()
                    return len([p for p in pods if p["spec"].get("nodeName") != node and _ready(p)]) == 3

                wait_until("3/3 ready on the remaining nodes", three_ready_elsewhere, 900, 1)
                timings["three_ready_s"] = since(t0)
        finally:
            node_verb(back, node)
        if how == "node_partition":
            healed = time.monotonic()

            def rejoined() -> bool:
                """The old primary reports itself a replica on the new leader's timeline (its pod's role
                label and Patroni's member data, published anew once it reaches the API server)."""
                st = _steady(kube, ns, name)
                instances = {i["name"]: i for i in (st or {}).get("instances") or []}
                return (st is not None and st["currentPrimary"] == new and instances[old]["role"] == "replica"
                        and instances[old].get("timeline") == instances[new].get("timeline"))  # fmt: skip

            wait_until("the old primary to rejoin", rejoined, 600, 1)
            timings["rejoined_after_heal_s"] = since(healed)
        for w in writers.values():
            w.wait_for_writes(10, 120)
    row: dict[str, Any] = {"promoted": new != old, "node": node, "load_1m": [round(load, 2)], **timings,
                           "respread_first": spread}  # fmt: skip
    for label, w in writers.items():
        row[label] = {"outage_s": round(w.longest_outage, 2), "lost": len(w.missing())}
    print(json.dumps({"kind": how, **row}), file=sys.stderr, flush=True)
    return row


def node_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The median and the maximum of each timing the node kinds record, over their trials."""
    out: dict[str, Any] = {}
    for key in ("leader_s", "writes_resumed_s", "node_lost_reported_s", "replaced_s", "three_ready_s",
                "rejoined_after_heal_s"):  # fmt: skip
        values = [float(r[key]) for r in rows if key in r]
        if values:
            out[key] = {"values": values, "p50": round(statistics.median(values), 1), "max": max(values)}
    return out
