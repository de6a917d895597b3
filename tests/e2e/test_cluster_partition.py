"""A network partition of the primary on real pods: every packet in or out of its pod is dropped (iptables
in the pod's own network namespace), so it can reach neither the API server nor any other member while
it keeps running. A synchronous standby must take over once the leader key expires, writes through -rw
must resume on it, the cut-off primary must stop taking writes by itself (failsafe mode keeps a primary
up only while it reaches every member: here it reaches none), and after healing it must rejoin as a
replica (pg_rewind) with no acknowledged write lost. The measured times are printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import (
    Partition,
    Writer,
    healthy,
    pod_netns,
    secret,
    serving_cluster,
    sql_in_netns,
    status,
)
from harness.waiting import wait_until

NS, NAME = "ha-partition", "part-db"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 5, 5  # the API's defaults, spelled out so the figures can be read


@pytest.fixture(scope="module")
def cluster(operator: Kube) -> Iterator[Kube]:
    yield from serving_cluster(
        operator,
        NS,
        NAME,
        {
            "replicas": 3,
            "synchronous": {"number": 1, "dataDurability": "required"},
            "patroni": {"ttl": TTL, "loopWait": LOOP_WAIT, "retryTimeout": RETRY_TIMEOUT},
        },
    )


def annotations(kube: Kube, configmap: str) -> dict[str, str]:
    return dict(get_json(kube, "configmap", configmap, "-n", NS)["metadata"].get("annotations") or {})


def test_partitioned_primary_is_replaced_stops_taking_writes_and_rejoins(cluster: Kube) -> None:
    st = wait_until("healthy", lambda: healthy(cluster, NS, NAME, 3), 300)
    old = st["currentPrimary"]
    # Quorum commit: every recorded voter is a candidate.
    recorded = wait_until(
        "a recorded synchronous standby",
        lambda: annotations(cluster, f"{NAME}-sync").get("sync_standby", ""),
        120,
    )
    standbys = str(recorded).split(",")
    assert json.loads(annotations(cluster, f"{NAME}-config")["config"]).get("failsafe_mode") is True
    pod_ip = get_json(cluster, "pod", old, "-n", NS)["status"]["podIP"]
    app = secret(cluster, NS, f"{NAME}-app")
    dsn = (
        f"host={pod_ip} port={app['port']} user={app['username']} password={app['password']} "
        f"dbname={app['dbname']}"
    )
    netns = pod_netns(cluster, NS, old)
    partition = Partition(netns)
    figures: dict[str, object] = {
        "measure": "primary_partition",
        "ttl": TTL,
        "loop_wait": LOOP_WAIT,
        "retry_timeout": RETRY_TIMEOUT,
        "old_primary": old,
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    with Writer(cluster, NS, NAME, "partition_writes") as writer:
        writer.wait_for_writes(20, 60)
        cut = time.monotonic()
        partition.cut()
        try:
            promoted_after = stopped_after = None
            old_state = ""
            while time.monotonic() - cut < 240 and (promoted_after is None or stopped_after is None):
                assert os.path.exists(netns), "the pod's sandbox (and with it the partition) was recreated"
                if promoted_after is None:
                    holder = annotations(cluster, f"{NAME}-leader").get("leader", "")
                    if holder and holder != old:
                        promoted_after, figures["new_primary"] = time.monotonic() - cut, holder
                if stopped_after is None:
                    # The old primary's own view, from inside its pod's network namespace.
                    try:
                        if sql_in_netns(netns, dsn, "select pg_is_in_recovery()") == "True":
                            stopped_after, old_state = time.monotonic() - cut, "demoted to read-only"
                    except subprocess.CalledProcessError as exc:
                        if "timeout" not in exc.stderr:  # refused: PostgreSQL stopped
                            stopped_after, old_state = time.monotonic() - cut, "stopped"
                time.sleep(0.5)
            assert promoted_after is not None, "no replica took over the partitioned primary's role"
            assert stopped_after is not None, "the partitioned primary kept accepting writes"
            assert figures["new_primary"] in standbys, f"promoted {figures['new_primary']}, not of {standbys}"
            # Writes through -rw resume on the new primary while the old one is still cut off.
            writer.wait_for_writes(20, 120)
            with pytest.raises(subprocess.CalledProcessError) as refused:
                sql_in_netns(netns, dsn, "insert into partition_writes (id) values (-1) returning id")
            figures["old_primary_refused_write"] = refused.value.stderr.strip().splitlines()[-1][:160]
            figures.update(
                promoted_after_s=round(promoted_after, 1),
                old_primary_stopped_writes_after_s=round(stopped_after, 1),
                old_primary_state=old_state,
                write_outage_s=round(writer.longest_outage, 2),
            )
        finally:
            partition.heal()
        healed = time.monotonic()
        new = str(figures["new_primary"])

        def rejoined() -> bool:
            instances = {i["name"]: i for i in (healthy(cluster, NS, NAME, 3) or {}).get("instances", [])}
            return (
                bool(instances)
                and instances[old]["role"] == "replica"
                and (instances[old].get("timeline") == instances[new].get("timeline"))
            )

        wait_until(f"{old} to rejoin as a replica on the new timeline", rejoined, 300, 1)
        figures["rejoined_after_heal_s"] = round(time.monotonic() - healed, 1)
        writer.wait_for_writes(10, 60)
    assert status(cluster, NS, NAME)["currentPrimary"] == new
    lost = writer.missing()
    figures.update(acknowledged=len(writer.acked), acknowledged_lost=len(lost))
    print(json.dumps(figures), flush=True)
    assert lost == [], f"acknowledged commits were lost: {lost[:10]}"
