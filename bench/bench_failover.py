"""Failover and switchover on the full profile, measured over trials: one JSON line.

For each trial, two writers insert through <name>-rw side by side while the primary is (a) SIGKILLed at
its container's init process, (b) deleted as a pod, (c) switched over on request, (d) SIGKILLed with the
operator scaled to zero (Patroni alone, with the dynamic settings the operator left it), (e) cut off the
network inside its pod's netns (iptables DROP, healed once writes have resumed on the new primary:
Patroni's ttl bounds this one), (f) SIGKILLed while a synchronous standby's stream is held back (its
netns drops what the primary sends it for HOLD_S before the kill, until a new leader is chosen), so the
other standby holds WAL that one lacks, which by chance happens about once in 40 kills under a steady
write load, (g) SIGKILLed as soon as another replica, SIGKILLed first, is back and streaming (a second
crash while the cluster re-admits the first). The writers: `fresh` opens a new connection per attempt;
`pooled` keeps one connection and opens a new one only when it broke, as an application's pool does, and
connects with the `<name>-app` Secret's `uri` as it stands (verify-full against its `ca.crt`, its connect
timeout, keepalives, user timeout and `target_session_attrs=read-write`), only `hostaddr` set to the
`-rw` ClusterIP. The figure is each writer's longest stretch without an acknowledged commit. Kinds are
interleaved trial by trial (their order rotated every round), so a drift of the shared machine's load
hits every kind alike. The cluster uses synchronous replication, and every acknowledged write is checked
after each trial. The machine is shared: the JSON carries the load average before and after, overall and
per trial. With --evidence DIR, a trial whose outage passes --evidence-over seconds leaves the cluster's
story of it (watches, logs, the writers' errors) in DIR (bench/failover_watch.py).

  python3 localkube/cluster.py up full && .venv/bin/python bench/bench_failover.py --trials 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

import bench_drain  # noqa: E402
from failover_nodes import NODE_KINDS, node_summary, node_trial, spec_additions  # noqa: E402

# A drain of the primary's node: bench_drain.py's trials, on a cluster of its own (one JSON line of its own).
DRAIN = "drain"
from failover_watch import Watch  # noqa: E402  (bench/, the script's own directory)
from localkube.common import Context  # noqa: E402

from harness.deployed_operator import OPERATOR_NAMESPACE, install_operator  # noqa: E402
from harness.kube import get_json  # noqa: E402
from harness.local_cluster import Kube  # noqa: E402
from harness.pgcluster import (  # noqa: E402
    Partition,
    StreamHold,
    Writer,
    healthy,
    kill_container,
    pod_netns,
    status,
)
from harness.waiting import wait_until  # noqa: E402

NS, NAME = "bench-failover", "bench-db"
KINDS = (
    "sigkill",
    "pod_delete",
    "switchover",
    "sigkill_patroni_only",
    "partition",
    "sigkill_async_ahead",
    "sigkill_after_rejoin",
)
# sigkill_async_ahead holds one synchronous standby's stream back this long before the kill: enough for
# the primary to send the other standby WAL this one never gets (the writers' in-flight commits).
HOLD_S = 0.3
SMALL = {"requests": {"cpu": "100m", "memory": "512Mi"}}
WRITERS = ("fresh", "pooled")


def scale_operator(kube: Kube, replicas: int) -> None:
    kube.kubectl("-n", OPERATOR_NAMESPACE, "scale", "deployment/pg-operator", f"--replicas={replicas}")
    if replicas:
        kube.kubectl(
            "-n",
            OPERATOR_NAMESPACE,
            "rollout",
            "status",
            "deployment/pg-operator",
            "--timeout=300s",
            timeout=320,
        )
    else:
        wait_until(
            "the operator to stop",
            lambda: not kube.kubectl("-n", OPERATOR_NAMESPACE, "get", "pods", "-o", "name").stdout.strip(),
            120,
            1,
        )


def trial(kube: Kube, how: str, table: str, evidence: Evidence | None = None) -> dict[str, Any]:
    if how in NODE_KINDS:  # three nodes (bench/failover_nodes.py)
        return node_trial(kube, NS, NAME, how, table, os.getloadavg()[0])
    if how == "sigkill_patroni_only":
        try:
            return _trial(kube, how, table, evidence, scale_down=True)
        finally:
            scale_operator(kube, 1)
    return _trial(kube, how, table, evidence)


class Evidence:
    """Where slow trials leave their evidence (--evidence), and from what outage on."""

    def __init__(self, directory: Path, over_s: float, watch: Watch) -> None:
        self.directory, self.over_s, self.watch = directory, over_s, watch


def _trial(
    kube: Kube, how: str, table: str, evidence: Evidence | None, scale_down: bool = False
) -> dict[str, Any]:
    def steady() -> dict[str, Any] | None:
        """Healthy as the operator reports it, and Patroni agrees: its leader key names the same
        primary and it has recorded a synchronous standby for it (until then strict synchronous mode
        promotes nobody, right after bootstrap or a failover)."""
        st = healthy(kube, NS, NAME, 3)
        sync = get_json(kube, "configmap", f"{NAME}-sync", "-n", NS)["metadata"].get("annotations") or {}
        leader = get_json(kube, "configmap", f"{NAME}-leader", "-n", NS)["metadata"].get("annotations") or {}
        primary = (st or {}).get("currentPrimary")
        ok = primary and leader.get("leader") == primary == sync.get("leader") and sync.get("sync_standby")
        return st if ok and members_caught_up() else None

    def members_caught_up() -> bool:
        """Every pod Ready as the kubelet says now, and every member on the primary's timeline as
        Patroni publishes it on its pod: the operator's status lags, and a killed primary that came
        back reports ready before pg_rewind has put it on the new timeline. Acting then kills the only
        healthy standby's peer: a double failure, whose strict synchronous mode blocks writes until a
        standby streams again (a 10 s outage seen so)."""
        pods = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={NAME}")["items"]
        states = [json.loads((p["metadata"].get("annotations") or {}).get("status") or "{}") for p in pods]
        ready = [
            any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
            for p in pods
        ]
        timelines = {s.get("timeline") for s in states}
        return len(pods) == 3 and all(ready) and len(timelines) == 1 and None not in timelines

    def leader_name() -> str | None:
        return (
            get_json(kube, "configmap", f"{NAME}-leader", "-n", NS)["metadata"].get("annotations") or {}
        ).get("leader")

    def sync_standbys() -> list[str]:
        sync = get_json(kube, "configmap", f"{NAME}-sync", "-n", NS)["metadata"].get("annotations") or {}
        return [n.strip() for n in str(sync.get("sync_standby") or "").split(",") if n.strip()]

    def pod_ip(pod: str) -> str:
        return str(get_json(kube, "pod", pod, "-n", NS)["status"]["podIP"])

    def replica_names(primary: str) -> list[str]:
        pods = get_json(kube, "pods", "-n", NS, "-l", f"db.example.com/cluster={NAME}")["items"]
        return sorted(p["metadata"]["name"] for p in pods if p["metadata"]["name"] != primary)

    def restarts(pod: str) -> int:
        obj = get_json(kube, "pod", pod, "-n", NS)
        return sum(int(c.get("restartCount") or 0) for c in obj["status"].get("containerStatuses") or [])

    def container_id(pod: str) -> str:
        obj = get_json(kube, "pod", pod, "-n", NS)
        return next(
            str(c.get("containerID")) for c in obj["status"]["containerStatuses"] if c["name"] == "postgres"
        )

    def streaming_again(pod: str, before: str) -> bool:
        """A new container is running and Ready (so its Patroni has published itself since), and Patroni
        says it streams from the leader."""
        obj = get_json(kube, "pod", pod, "-n", NS)
        member = json.loads((obj["metadata"].get("annotations") or {}).get("status") or "{}")
        new = any(
            c["name"] == "postgres" and c.get("containerID") not in (None, before) and c.get("ready")
            for c in obj["status"].get("containerStatuses") or []
        )
        return new and member.get("replication_state") == "streaming"

    st = wait_until("a steady cluster", steady, 600, 1)
    old = st["currentPrimary"]
    extra: dict[str, Any] = {}
    if scale_down:
        scale_operator(kube, 0)
    partition = Partition(pod_netns(kube, NS, old)) if how == "partition" else None
    load_before = os.getloadavg()[0]
    writers = {
        "fresh": Writer(kube, NS, NAME, table),
        "pooled": Writer(kube, NS, NAME, f"{table}_pooled", persistent=True, app_uri=True),
    }

    def any_outage() -> bool:
        return any(w.outages for w in writers.values())

    with writers["fresh"], writers["pooled"]:
        for w in writers.values():
            w.wait_for_writes(20, 60)
        acted_at = time.time()
        if partition is not None:
            partition.cut()
        elif how in ("sigkill", "sigkill_patroni_only"):
            kill_container(kube, NS, old)
        elif how == "sigkill_async_ahead":
            held = sync_standbys()[0]
            hold = StreamHold(pod_netns(kube, NS, held), pod_ip(old))
            hold.hold()
            try:
                time.sleep(HOLD_S)
                acted_at = time.time()
                kill_container(kube, NS, old)
                wait_until("a new leader", lambda: leader_name() not in (None, old), 120, 0.05)
            finally:
                hold.release()
            extra["held"] = held
        elif how == "sigkill_after_rejoin":
            # The replica the kubelet restarted least often: its restart back-off is the shortest.
            other = min(replica_names(old), key=restarts)
            before = container_id(other)
            kill_container(kube, NS, other)
            started = time.time()
            # The kubelet's back-off reaches 5 minutes for a container killed again and again.
            wait_until("the first victim to stream again", lambda: streaming_again(other, before), 600, 0.1)
            extra["rejoined_after_s"] = round(time.time() - started, 2)
            extra["voter_at_kill"] = other in sync_standbys()
            acted_at = time.time()
            kill_container(kube, NS, old)
        elif how == "pod_delete":
            kube.kubectl("delete", "pod", old, "-n", NS, "--wait=false")
        else:
            # auto: the operator picks the synchronous standby (Patroni refuses any other replica).
            kube.kubectl(
                "annotate", "pgc", NAME, "-n", NS, "db.example.com/switchover-to=auto", "--overwrite"
            )
        if how == "switchover":
            # Done or refused, the operator answers by clearing the request; a handover may be gapless.
            wait_until(
                "the switchover request to be answered",
                lambda: (
                    any_outage()
                    or (
                        "db.example.com/switchover-to"
                        not in (get_json(kube, "pgc", NAME, "-n", NS)["metadata"].get("annotations") or {})
                    )
                ),
                300,
                0.2,
            )
        else:
            try:
                wait_until("the outage to end", any_outage, 300, 0.1)
            finally:
                if partition is not None:
                    partition.heal()
        # Each writer's own outage is over once it has acknowledged more commits.
        for w in writers.values():
            w.wait_for_writes(10, 120)
    row: dict[str, Any] = {
        "promoted": None,
        "load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **extra,
    }
    for label, w in writers.items():
        row[label] = {"outage_s": round(w.longest_outage, 2), "lost": len(w.missing())}
    if scale_down:
        # Without the operator nobody writes the status: ask Patroni's leader key who won.
        new = wait_until(
            "a leader",
            lambda: (
                get_json(kube, "configmap", f"{NAME}-leader", "-n", NS)["metadata"]
                .get("annotations", {})
                .get("leader")
            ),
            300,
            1,
        )
    else:
        new = wait_until("healthy again", lambda: healthy(kube, NS, NAME, 3), 600, 1)["currentPrimary"]
    row["promoted"] = new != old
    worst = max(w.longest_outage for w in writers.values())
    if evidence is not None and worst > evidence.over_s:
        where = evidence.directory / f"{table}-{worst:.1f}s"
        evidence.watch.dump(
            where,
            acted_at - 10,
            time.time(),
            writers,
            old,
            {
                "kind": how,
                "table": table,
                "old_primary": old,
                "new_primary": new,
                "acted_at": acted_at,
                **row,
                "spans": {k: w.spans for k, w in writers.items()},
            },
        )
        row["evidence"] = str(where)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help=f"comma-separated scenarios to run, of {','.join((*KINDS, *NODE_KINDS, 'drain'))} (default: all "
        f"but the node kinds and drain, which need PGOP_FULL_NODES=3)",
    )
    parser.add_argument(
        "--installed",
        action="store_true",
        help="use the images and the operator already in the cluster (no rebuild when src/ changed since)",
    )
    parser.add_argument(
        "--evidence",
        type=Path,
        help="a directory where each trial slower than --evidence-over leaves its evidence",
    )
    parser.add_argument("--evidence-over", type=float, default=4.0, help="seconds (default 4)")
    args = parser.parse_args()
    unknown = sorted(set(args.kinds.split(",")) - set(KINDS) - set(NODE_KINDS) - {DRAIN})
    if unknown:
        choices = ", ".join((*KINDS, *NODE_KINDS, DRAIN))
        parser.error(f"--kinds: unknown {', '.join(unknown)} (choose from {choices})")
    if DRAIN in args.kinds.split(","):
        # A drain needs a pooler, required spread and writers in pods: bench_drain.py's own cluster.
        print(json.dumps(bench_drain.run(args.trials)), flush=True)
        args.kinds = ",".join(k for k in args.kinds.split(",") if k != DRAIN)
        if not args.kinds:
            return 0
    ctx = Context()
    kube = Kube(profile="full", kubeconfig=str(ctx.admin_kubeconfig), ctx=ctx)
    if not args.installed:
        install_operator(kube)

    # The previous run deletes its namespace without waiting: a run started right after would create its
    # cluster in a namespace that is still going away.
    def phase() -> str:
        return str(kube.kubectl("get", "namespace", NS, "-o", "jsonpath={.status.phase}", check=False).stdout)

    wait_until("the previous run's namespace to be gone", lambda: phase().strip() != "Terminating", 300, 1)
    kube.kubectl("create", "namespace", NS, check=False)
    body = {
        "apiVersion": "db.example.com/v1alpha1",
        "kind": "PostgresCluster",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "replicas": 3,
            "version": "16",
            "storage": "1Gi",
            "resources": SMALL,
            "synchronous": {"number": 1, "dataDurability": "required"},
            **spec_additions(args.kinds.split(",")),
        },
    }
    started = time.monotonic()
    kube.kubectl("apply", "-f", "-", input=json.dumps(body))
    wait_until("the cluster to be healthy", lambda: healthy(kube, NS, NAME, 3), 900, 1)
    ready_s = time.monotonic() - started
    load_before = os.getloadavg()
    kinds = tuple(args.kinds.split(","))
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    watch = Watch(kube, NS, NAME) if args.evidence else None
    evidence = Evidence(args.evidence, args.evidence_over, watch) if watch is not None else None
    interrupted, aborted = False, ""
    try:
        for i in range(args.trials):
            for how in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
                results[how].append(trial(kube, how, f"{how}_{i}", evidence))
                print(f"{how} #{i + 1}: {json.dumps(results[how][-1])}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        # Stopped by hand (a deadline): report the trials that finished, and say so.
        interrupted = True
    except AssertionError as exc:
        # A trial whose cluster did not get where it must (a wait timed out): report the trials that
        # finished and why the run ended, and fail.
        aborted = str(exc)
    finally:
        if watch is not None:
            watch.stop()
        final = status(kube, NS, NAME)
        kube.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    out: dict[str, Any] = {"bench": "failover", "trials": args.trials, "apply_to_ready_s": round(ready_s, 1)}
    if interrupted:
        out["interrupted"] = True
    if aborted:
        out["aborted"] = aborted
    for how, rows in results.items():
        if not rows:
            continue
        per_kind: dict[str, Any] = {"trials": len(rows), "promoted": sum(bool(r["promoted"]) for r in rows)}
        for label in WRITERS:
            outages = [r[label]["outage_s"] for r in rows]
            per_kind[label] = {
                "outages_s": outages,
                "p50_s": round(statistics.median(outages), 2),
                "max_s": max(outages),
                "lost": sum(r[label]["lost"] for r in rows),
            }
        per_kind["load_1m"] = [r["load_1m"] for r in rows]
        if how in NODE_KINDS:
            per_kind.update(node_summary(rows))
        out[how] = per_kind
    out["acknowledged_writes_lost"] = sum(
        r[label]["lost"] for rows in results.values() for r in rows for label in WRITERS
    )
    out["final_phase"] = final.get("phase")
    out["load_avg_1m_before"] = round(load_before[0], 2)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    out["cpus"] = os.cpu_count()
    print(json.dumps(out))
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
