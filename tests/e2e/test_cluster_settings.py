"""Changing PostgreSQL parameters and synchronous replication on a running cluster, on real pods.

A setting PostgreSQL reloads reaches every instance without a restart; one that needs a restart is
applied by restarting the replicas one at a time and then the primary in place, under a writer that
loses nothing and with the primary staying where it is; a removed parameter returns to its default."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import psycopg
import pytest

from harness.extensions import on_each_pod as query_each_pod
from harness.extensions import pending_restart
from harness.extensions import start_times as postmaster_start_times
from harness.kube import get_json
from harness.local_cluster import Kube
from harness.pgcluster import SYNC_NAME, SYNC_NAMESPACE, Writer, healthy, secret, wait_serving
from harness.waiting import wait_until

# The e2e tier's synchronous cluster (its session fixture `sync_cluster`; the failover module shares it).
NS, NAME = SYNC_NAMESPACE, SYNC_NAME


@pytest.fixture(scope="module")
def cluster(sync_cluster: Kube) -> Kube:
    wait_serving(sync_cluster, NS, NAME, 3, 300)
    return sync_cluster


def on_each_pod(kube: Kube, query: str) -> dict[str, Any]:
    """The query's single value on every instance, connecting to each pod directly."""
    return query_each_pod(kube, NS, NAME, query)


def start_times(kube: Kube) -> dict[str, datetime]:
    return postmaster_start_times(kube, NS, NAME)


def pending(kube: Kube) -> list[str]:
    return pending_restart(kube, NS, NAME)


def set_parameters(kube: Kube, parameters: dict[str, str | None]) -> None:
    patch = {"spec": {"postgresql": {"parameters": parameters}}}
    kube.kubectl("patch", "pgc", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))


def events(kube: Kube, reason: str) -> list[str]:
    items = get_json(kube, "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")["items"]
    return [e.get("message", "") for e in items if e.get("reason") == reason]


def everywhere(kube: Kube, query: str, expected: str) -> bool:
    values = on_each_pod(kube, query)
    return len(values) == 3 and set(values.values()) == {expected}


def test_a_reloadable_parameter_reaches_every_instance_without_a_restart(cluster: Kube) -> None:
    before = start_times(cluster)
    assert set(on_each_pod(cluster, "show work_mem").values()) == {"4MB"}
    set_parameters(cluster, {"work_mem": "8MB"})
    wait_until("work_mem 8MB on every instance", lambda: everywhere(cluster, "show work_mem", "8MB"), 120, 1)
    assert start_times(cluster) == before, "a reload-only parameter restarted an instance"
    assert pending(cluster) == []
    # Told once pg_settings on the primary shows it (read back after Patroni's reload).
    wait_until(
        "ConfigurationUpdated naming work_mem",
        lambda: any("work_mem" in m for m in events(cluster, "ConfigurationUpdated")),
        60,
        1,
    )


def test_a_parameter_that_needs_a_restart_rolls_replicas_first_then_the_primary_in_place(
    cluster: Kube,
) -> None:
    st = wait_until("healthy", lambda: healthy(cluster, NS, NAME, 3), 300, 2)
    primary = st["currentPrimary"]
    before = start_times(cluster)
    assert set(on_each_pod(cluster, "show shared_buffers").values()) == {"128MB"}
    with Writer(cluster, NS, NAME, "settings_writes") as writer:
        writer.wait_for_writes(20, 60)
        changed_at = time.monotonic()
        set_parameters(cluster, {"work_mem": "8MB", "shared_buffers": "64MB"})

        def applied() -> bool:
            return everywhere(cluster, "show shared_buffers", "64MB") and not pending(cluster)

        wait_until("shared_buffers 64MB on every instance", applied, 600, 2)
        took = time.monotonic() - changed_at
        st = wait_until("healthy again", lambda: healthy(cluster, NS, NAME, 3), 300, 2)
        writer.wait_for_writes(20, 60)
    print(
        json.dumps(
            {
                "measure": "restart_for_parameter",
                "seconds_to_apply": round(took, 1),
                "write_outage_s": round(writer.longest_outage, 2),
                "outages": len(writer.outages),
                "acknowledged": len(writer.acked),
            }
        ),
        flush=True,
    )
    assert writer.missing() == []
    assert st["currentPrimary"] == primary, "a parameter restart moved the primary"
    after = start_times(cluster)
    assert all(after[name] > before[name] for name in before), "an instance was not restarted"
    replicas = [name for name in after if name != primary]
    assert all(after[r] < after[primary] for r in replicas), f"primary restarted before a replica: {after}"
    restarted = {
        name
        for m in events(cluster, "Restarted")
        if "shared_buffers" in m
        for name in after
        if name in m.split()
    }
    assert restarted == set(after), f"Restarted Events name {restarted}, not every instance"
    assert everywhere(cluster, "show work_mem", "8MB")


def test_removed_parameters_return_to_their_defaults_and_sync_replication_can_be_turned_off(
    cluster: Kube,
) -> None:
    wait_until("healthy", lambda: healthy(cluster, NS, NAME, 3), 300, 2)
    app = secret(cluster, NS, f"{NAME}-app")

    def primary() -> str:
        return str((healthy(cluster, NS, NAME, 3) or {}).get("currentPrimary") or "")

    def sync_names() -> str:
        pod = get_json(cluster, "pod", primary(), "-n", NS)
        with psycopg.connect(
            host=pod["status"]["podIP"],
            port=int(app["port"]),
            user=app["username"],
            password=app["password"],
            dbname=app["dbname"],
            connect_timeout=3,
        ) as conn:
            row = conn.execute("show synchronous_standby_names").fetchone()
        return str(row[0]) if row else ""

    wait_until("a synchronous standby named", lambda: sync_names() != "", 120, 1)
    cluster.kubectl(
        "patch",
        "pgc",
        NAME,
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "postgresql": {"parameters": {"work_mem": None, "shared_buffers": None}},
                    "synchronous": {"number": 0},
                }
            }
        ),
    )

    def defaults() -> bool:
        return (
            everywhere(cluster, "show work_mem", "4MB")
            and everywhere(cluster, "show shared_buffers", "128MB")
            and not pending(cluster)
        )

    wait_until("work_mem and shared_buffers back to their defaults", defaults, 600, 2)
    wait_until("no synchronous standby named", lambda: sync_names() == "", 120, 1)
    config = json.loads(
        get_json(cluster, "configmap", f"{NAME}-config", "-n", NS)["metadata"]["annotations"]["config"]
    )
    assert config["synchronous_mode"] is False
    assert "work_mem" not in config["postgresql"]["parameters"]


def degraded(kube: Kube) -> dict[str, Any]:
    st = get_json(kube, "pgc", NAME, "-n", NS).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c.get("type") == "Degraded"), {})


def event_names(kube: Kube) -> set[str]:
    items = get_json(kube, "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")["items"]
    return {e["metadata"]["name"] for e in items}


def new_events(kube: Kube, before: set[str], reason: str) -> list[dict[str, Any]]:
    items = get_json(kube, "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")["items"]
    return [e for e in items if e["metadata"]["name"] not in before and e.get("reason") == reason]


def write_on_primary(kube: Kube, value: str) -> None:
    """A write acknowledged by the primary, connecting to its pod directly."""
    app = secret(kube, NS, f"{NAME}-app")
    primary = str(get_json(kube, "pgc", NAME, "-n", NS)["status"]["currentPrimary"])
    pod = get_json(kube, "pod", primary, "-n", NS)
    with psycopg.connect(
        host=pod["status"]["podIP"],
        port=int(app["port"]),
        user=app["username"],
        password=app["password"],
        dbname=app["dbname"],
        connect_timeout=3,
    ) as conn:
        conn.execute("create table if not exists settings_probe (v text)")
        conn.execute("insert into settings_probe values (%s)", (value,))
        row = conn.execute("select count(*) from settings_probe where v = %s", (value,)).fetchone()
    assert row is not None and row[0] == 1


def test_a_value_postgresql_refuses_is_reported_never_sent_and_the_rest_of_the_edit_applies(
    cluster: Kube,
) -> None:
    wait_until("healthy", lambda: healthy(cluster, NS, NAME, 3), 300, 2)
    work_mem = on_each_pod(cluster, "show work_mem")
    assert len(set(work_mem.values())) == 1
    seen = event_names(cluster)
    # A value PostgreSQL cannot parse, and a misspelled name (which would keep PostgreSQL from starting
    # at its next restart), beside a valid change.
    set_parameters(cluster, {"work_mem": "lots", "work_mme": "8MB", "maintenance_work_mem": "96MB"})

    said = 'invalid value for parameter "work_mem": "lots"'
    misspelled = 'unrecognized configuration parameter "work_mme"'
    cond = wait_until(
        "Degraded ParameterRefused",
        lambda: (
            d
            if (d := degraded(cluster)).get("reason") == "ParameterRefused" and d.get("status") == "True"
            else None
        ),
        120,
        1,
    )
    assert said in cond["message"] and misspelled in cond["message"], cond
    warnings = wait_until(
        "a ParameterRefused Warning", lambda: new_events(cluster, seen, "ParameterRefused"), 60, 1
    )
    assert all(e["type"] == "Warning" for e in warnings)
    assert any(said in e["message"] and misspelled in e["message"] for e in warnings), warnings
    # The valid half of the same edit is applied everywhere; the refused value reaches no instance.
    wait_until(
        "maintenance_work_mem 96MB everywhere",
        lambda: everywhere(cluster, "show maintenance_work_mem", "96MB"),
        120,
        1,
    )
    assert on_each_pod(cluster, "show work_mem") == work_mem
    config = json.loads(
        get_json(cluster, "configmap", f"{NAME}-config", "-n", NS)["metadata"]["annotations"]["config"]
    )
    assert config["postgresql"]["parameters"].get("work_mem") != "lots"
    assert "work_mme" not in config["postgresql"]["parameters"]
    assert config["postgresql"]["parameters"]["maintenance_work_mem"] == "96MB"
    # ConfigurationUpdated names what PostgreSQL shows, and never the refused parameter.
    updated = wait_until(
        "ConfigurationUpdated for maintenance_work_mem",
        lambda: [
            e
            for e in new_events(cluster, seen, "ConfigurationUpdated")
            if "maintenance_work_mem" in e["message"]
        ],
        60,
        1,
    )
    assert all("work_m" not in e["message"].replace("maintenance_work_mem", "") for e in updated), updated
    assert all("applied on primary" in e["message"] for e in updated), updated
    # Still serving: the primary acknowledges writes, every instance ready.
    write_on_primary(cluster, "while work_mem was refused")
    assert healthy(cluster, NS, NAME, 3)

    set_parameters(cluster, {"work_mem": None, "work_mme": None, "maintenance_work_mem": None})
    wait_until("no longer Degraded", lambda: degraded(cluster).get("status") == "False", 120, 1)
    wait_until(
        "maintenance_work_mem back to 64MB",
        lambda: everywhere(cluster, "show maintenance_work_mem", "64MB"),
        120,
        1,
    )


def test_a_value_an_instance_cannot_start_with_halts_the_restart_at_one_replica_and_reverting_heals(
    cluster: Kube,
) -> None:
    st = wait_until("healthy", lambda: healthy(cluster, NS, NAME, 3), 300, 2)
    primary = st["currentPrimary"]
    before = on_each_pod(cluster, "show max_connections")
    assert len(set(before.values())) == 1
    starts = start_times(cluster)
    set_parameters(cluster, {"max_connections": "200000"})

    cond = wait_until(
        "Degraded RolloutHalted",
        lambda: (
            d
            if (d := degraded(cluster)).get("reason") == "RolloutHalted" and d.get("status") == "True"
            else None
        ),
        600,
        2,
    )
    message = cond["message"]
    halted_at = message.split()[0]
    print(json.dumps({"measure": "restart_halt", "message": message}), flush=True)
    assert halted_at != primary and halted_at.startswith(f"{NAME}-"), message
    assert "max_connections" in message and f"stopped at {halted_at}" in message, message
    assert f"primary {primary} keeps serving" in message, message
    halts = wait_until(
        "a RolloutHalted Warning",
        lambda: [e for e in new_events(cluster, set(), "RolloutHalted") if e["message"] == message],
        30,
        1,
    )
    assert all(e["type"] == "Warning" for e in halts), halts
    # One replica down, nothing else restarted, the primary where it was and writable.
    st = get_json(cluster, "pgc", NAME, "-n", NS)["status"]
    assert st["currentPrimary"] == primary
    ready = {i["name"]: i["ready"] for i in st["instances"]}
    assert ready[halted_at] is False and sum(1 for r in ready.values() if not r) == 1, ready
    write_on_primary(cluster, "while max_connections was halted")
    others = {name: t for name, t in starts.items() if name != halted_at}
    app = secret(cluster, NS, f"{NAME}-app")
    for name, started in others.items():
        pod = get_json(cluster, "pod", name, "-n", NS)
        with psycopg.connect(
            host=pod["status"]["podIP"],
            port=int(app["port"]),
            user=app["username"],
            password=app["password"],
            dbname=app["dbname"],
            connect_timeout=3,
        ) as conn:
            row = conn.execute(
                "select pg_postmaster_start_time(), current_setting('max_connections')"
            ).fetchone()
        assert row is not None and row[0] == started and row[1] == before[name], (name, row)

    reverted_at = time.monotonic()
    set_parameters(cluster, {"max_connections": None})
    wait_until("healthy after the revert", lambda: healthy(cluster, NS, NAME, 3), 300, 1)
    healed = time.monotonic() - reverted_at
    wait_until("no longer Degraded", lambda: degraded(cluster).get("status") == "False", 120, 1)
    print(json.dumps({"measure": "restart_halt_heal", "seconds": round(healed, 1)}), flush=True)
    assert on_each_pod(cluster, "show max_connections") == before
    # Patroni clears pending_restart in the pods' annotation on its next loop after the reload.
    wait_until("nothing waits for a restart", lambda: pending(cluster) == [], 60, 1)
