"""A crashed primary hands over deterministically: Patroni's dynamic settings the operator keeps, and
the leader-key release that, with synchronous replication, waits for the recorded synchronous standby."""

from __future__ import annotations

import json
from typing import Any

from harness.pods import instance_pod as pod
from harness.pods import leader_cm
from pg_operator.orchestration.failover import plan_lock_release, sync_standbys
from pg_operator.orchestration.instances import instances_from_pods
from pg_operator.orchestration.patroni_settings import dynamic_config, dynamic_config_patch


def config_cm(config: Any) -> dict[str, Any]:
    raw = config if isinstance(config, str) else json.dumps(config)
    return {"metadata": {"name": "db-config", "resourceVersion": "7", "annotations": {"config": raw}}}


def sync_cm(leader: str, standbys: str) -> dict[str, Any]:
    return {"metadata": {"name": "db-sync", "annotations": {"leader": leader, "sync_standby": standbys}}}


def test_primary_start_timeout_zero_is_patched_in_when_patroni_has_another_value() -> None:
    current = {"ttl": 20, "loop_wait": 5, "postgresql": {"use_pg_rewind": True}}
    assert dynamic_config_patch(config_cm(current)) == {"primary_start_timeout": 0}
    assert dynamic_config_patch(config_cm({**current, "primary_start_timeout": 300})) == {
        "primary_start_timeout": 0
    }


def test_nothing_to_patch_once_patroni_holds_the_setting() -> None:
    assert dynamic_config_patch(config_cm({"ttl": 20, "primary_start_timeout": 0})) is None


def test_nothing_to_patch_before_patroni_bootstrapped() -> None:
    assert dynamic_config_patch(None) is None
    assert dynamic_config_patch({"metadata": {"name": "db-config"}}) is None
    assert dynamic_config_patch(config_cm("not json")) is None
    assert dynamic_config(config_cm("[1, 2]")) is None


def test_sync_standbys_only_for_the_leader_they_were_recorded_for() -> None:
    assert sync_standbys(sync_cm("db-0", "db-2"), "db-0") == {"db-2"}
    assert sync_standbys(sync_cm("db-0", "db-1,db-2"), "db-0") == {"db-1", "db-2"}
    assert sync_standbys(sync_cm("db-1", "db-2"), "db-0") is None  # stale: recorded for another leader
    assert sync_standbys(sync_cm("db-0", ""), "db-0") == frozenset()  # active, none recorded yet
    assert sync_standbys(None, "db-0") is None


def test_with_synchronous_replication_the_key_is_released_only_for_the_sync_standby() -> None:
    dead = pod("db-0", "primary", ready=False, container="terminated")
    sync_running = [dead, pod("db-1"), pod("db-2")]
    release = plan_lock_release(leader_cm("db-0"), instances_from_pods(sync_running), sync_cm("db-0", "db-2"))
    assert release is not None and release.holder == "db-0"
    # The synchronous standby is down too: Patroni would promote nobody else, so the key stays.
    sync_down = [dead, pod("db-1"), pod("db-2", ready=False, container="terminated")]
    recorded = sync_cm("db-0", "db-2")
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(sync_down), recorded) is None
    # Asynchronous (no sync key for this leader): any running replica will do.
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(sync_down), None) is not None


def test_no_release_while_synchronous_mode_has_recorded_no_standby_yet() -> None:
    # Right after bootstrap Patroni may not have recorded a synchronous standby: in strict mode it then
    # promotes nobody, and a released key would only be taken back by the restarted old primary.
    pods = [pod("db-0", "primary", ready=False, container="terminated"), pod("db-1"), pod("db-2")]
    assert plan_lock_release(leader_cm("db-0"), instances_from_pods(pods), sync_cm("db-0", "")) is None
