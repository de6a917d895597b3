"""Settings changes after bootstrap: what the operator PATCHes into Patroni's dynamic configuration, and
the order in which members Patroni marks pending_restart are restarted."""

from __future__ import annotations

import json
from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.orchestration import patroni_settings
from pg_operator.orchestration.instances import instances_from_pods, parse_members
from pg_operator.orchestration.patroni_settings import (
    changed_parameter_names,
    desired_dynamic_settings,
    dynamic_config_patch,
)
from pg_operator.orchestration.rollout import plan_restart
from pg_operator.specs.configmap import dynamic_settings

BOOTSTRAPPED: dict[str, Any] = {
    "ttl": 20,
    "loop_wait": 2,
    "retry_timeout": 5,
    "primary_start_timeout": 0,
    "synchronous_mode": "quorum",
    "synchronous_node_count": 1,
    "synchronous_mode_strict": True,
    "maximum_lag_on_failover": 1048576,
    "failsafe_mode": True,
    "postgresql": {
        "use_pg_rewind": True,
        "use_slots": True,
        "parameters": {
            "wal_level": "replica",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_retrieve_retry_interval": "1s",
            "work_mem": "4MB",
        },
    },
}
TIMING = {"ttl": 20, "loop_wait": 2, "retry_timeout": 5}


def config_cm(value: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "db-config", "annotations": {"config": json.dumps(value)}}}


def desired(parameters: dict[str, str], number: int = 1, durability: str = "required") -> dict[str, Any]:
    return desired_dynamic_settings(parameters, number, durability, TIMING)


def test_nothing_to_patch_when_patroni_holds_the_spec() -> None:
    assert dynamic_config_patch(config_cm(BOOTSTRAPPED), desired({"work_mem": "4MB"})) is None


def test_changed_added_and_removed_parameters() -> None:
    patch = dynamic_config_patch(config_cm(BOOTSTRAPPED), desired({"shared_buffers": "256MB"}))
    # Only the parameters: the other postgresql keys (use_slots, ...) are not the operator's to resend.
    assert patch == {"postgresql": {"parameters": {"shared_buffers": "256MB", "work_mem": None}}}
    assert changed_parameter_names(patch) == ["shared_buffers", "work_mem"]
    changed = dynamic_config_patch(config_cm(BOOTSTRAPPED), desired({"work_mem": "8MB"}))
    assert changed == {"postgresql": {"parameters": {"work_mem": "8MB"}}}


def test_numbers_and_their_strings_are_the_same_setting() -> None:
    held = {
        **BOOTSTRAPPED,
        "postgresql": {"parameters": {**BOOTSTRAPPED["postgresql"]["parameters"], "max_wal_senders": "10"}},
    }
    assert dynamic_config_patch(config_cm(held), desired({"work_mem": "4MB"})) is None


def test_a_cluster_bootstrapped_with_one_named_standby_moves_to_quorum_commit() -> None:
    before = {**BOOTSTRAPPED, "synchronous_mode": True}
    patch = dynamic_config_patch(config_cm(before), desired({"work_mem": "4MB"}))
    assert patch == {"synchronous_mode": "quorum"}


def test_synchronous_replication_changes() -> None:
    assert dynamic_config_patch(config_cm(BOOTSTRAPPED), desired({"work_mem": "4MB"}, 0)) == {
        "synchronous_mode": False,
        "synchronous_mode_strict": False,
    }
    assert dynamic_config_patch(config_cm(BOOTSTRAPPED), desired({"work_mem": "4MB"}, 2, "preferred")) == {
        "synchronous_node_count": 2,
        "synchronous_mode_strict": False,
    }


def test_timing_changes() -> None:
    patch = dynamic_config_patch(
        config_cm(BOOTSTRAPPED),
        desired_dynamic_settings(
            {"work_mem": "4MB"}, 1, "required", {"ttl": 30, "loop_wait": 2, "retry_timeout": 5}
        ),
    )
    assert patch == {"ttl": 30}


def test_desired_settings_from_the_cluster_spec() -> None:
    cluster = PostgresCluster.from_obj(
        {
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1"},
            "spec": {
                "replicas": 3,
                "version": "16",
                "storage": "1Gi",
                "postgresql": {"parameters": {"shared_buffers": "256MB"}},
                "synchronous": {"number": 1, "dataDurability": "preferred"},
            },
        }
    )
    settings = dynamic_settings(cluster)
    assert settings["postgresql"]["parameters"] == {
        "wal_level": "replica",
        "max_wal_senders": 10,
        "max_replication_slots": 10,
        "wal_retrieve_retry_interval": "1s",
        "shared_buffers": "256MB",
    }
    assert settings["synchronous_mode"] == "quorum" and settings["synchronous_mode_strict"] is False
    assert settings["primary_start_timeout"] == 0 and {"ttl", "loop_wait", "retry_timeout"} <= set(settings)


def pod(name: str, role: str, *, pending: dict[str, Any] | None = None, ready: bool = True) -> dict[str, Any]:
    state: dict[str, Any] = {"role": role, "state": "running"}
    if pending is not None:
        state.update(pending_restart=True, pending_restart_reason=pending)
    return {
        "metadata": {
            "name": name,
            "labels": {"role": role},
            "annotations": {"status": json.dumps(state)},
            "creationTimestamp": "2026-12-01T10:00:00Z",
        },
        "spec": {"containers": [{"name": "postgres", "image": "img"}]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "postgres", "state": {"running": {}}, "restartCount": 0}],
            "podIP": "10.0.0.1",
        },
    }


SHARED = {"shared_buffers": {"old_value": "128MB", "new_value": "256MB"}}
STREAMING = parse_members(
    {
        "members": [
            {"name": "db-0", "role": "leader", "state": "running", "lag": 0},
            {"name": "db-1", "role": "sync_standby", "state": "streaming", "lag": 0},
            {"name": "db-2", "role": "replica", "state": "streaming", "lag": 0},
        ]
    }
)


def test_pending_restart_is_read_from_the_pod_annotation() -> None:
    [waiting, current] = instances_from_pods([pod("db-0", "primary", pending=SHARED), pod("db-1", "replica")])
    assert waiting.pending_restart == ("shared_buffers",)
    assert current.pending_restart is None


def test_replicas_restart_first_highest_ordinal_then_the_primary_in_place() -> None:
    pods = [
        pod("db-0", "primary", pending=SHARED),
        pod("db-1", "replica", pending=SHARED),
        pod("db-2", "replica", pending=SHARED),
    ]
    first = plan_restart(instances_from_pods(pods, STREAMING), 3)
    assert (first.kind, first.target) == ("restart", "db-2") and "shared_buffers" in first.reason
    pods[2] = pod("db-2", "replica")
    assert plan_restart(instances_from_pods(pods, STREAMING), 3).target == "db-1"
    pods[1] = pod("db-1", "replica")
    last = plan_restart(instances_from_pods(pods, STREAMING), 3)
    assert (last.kind, last.target) == ("restart", "db-0") and "in place" in last.reason
    pods[0] = pod("db-0", "primary")
    assert plan_restart(instances_from_pods(pods, STREAMING), 3).kind == "none"


def test_no_restart_while_an_instance_is_down_or_behind() -> None:
    pods = [
        pod("db-0", "primary", pending=SHARED),
        pod("db-1", "replica", ready=False),
        pod("db-2", "replica", pending=SHARED),
    ]
    action = plan_restart(instances_from_pods(pods, STREAMING), 3)
    assert action.kind == "wait" and "db-1" in action.reason
    pods[1] = pod("db-1", "replica")
    behind = parse_members(
        {
            "members": [
                {"name": "db-0", "role": "leader", "state": "running", "lag": 0},
                {"name": "db-1", "role": "replica", "state": "streaming", "lag": 10**9},
                {"name": "db-2", "role": "replica", "state": "streaming", "lag": 0},
            ]
        }
    )
    action = plan_restart(instances_from_pods(pods, behind), 3)
    assert action.kind == "wait" and "catch up" in action.reason
    # Without Patroni's word on lag, a replica is not known to be caught up.
    assert plan_restart(instances_from_pods(pods), 3).kind == "wait"
    # One instance missing: wait for it.
    assert plan_restart(instances_from_pods(pods[:2], STREAMING), 3).kind == "wait"


def test_single_instance_restarts_in_place() -> None:
    action = plan_restart(instances_from_pods([pod("db-0", "primary", pending=SHARED)], STREAMING), 1)
    assert (action.kind, action.target) == ("restart", "db-0")


def test_a_promotion_sleeps_out_at_most_a_second_of_wal_retry_unless_the_user_says_otherwise() -> None:
    # A standby promoted while it restarts streaming sleeps out the rest of this interval first.
    assert patroni_settings.BASE_PARAMETERS["wal_retrieve_retry_interval"] == "1s"
    mine = patroni_settings.desired_dynamic_settings({}, 1, "required")
    assert mine["postgresql"]["parameters"]["wal_retrieve_retry_interval"] == "1s"
    theirs = patroni_settings.desired_dynamic_settings({"wal_retrieve_retry_interval": "5s"}, 1, "required")
    assert theirs["postgresql"]["parameters"]["wal_retrieve_retry_interval"] == "5s"


# --- shared_preload_libraries: a restart-only setting like any other ------------------------------------
PRELOAD = {"shared_preload_libraries": {"old_value": "", "new_value": "pg_stat_statements,pgaudit"}}
PRELOADED = {"shared_preload_libraries": "pg_stat_statements,pgaudit", "pgaudit.log": "ddl"}


def test_a_declared_preload_is_patched_into_the_dynamic_configuration_alone() -> None:
    cluster = PostgresCluster.from_obj(
        {
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1"},
            "spec": {
                "replicas": 3,
                "version": "18",
                "storage": "1Gi",
                "postgresql": {"parameters": {"work_mem": "4MB", **PRELOADED}},
                "synchronous": {"number": 1},
            },
        }
    )
    # The operator preloads nothing of its own: the user's list is the whole setting.
    settings = dynamic_settings(cluster)
    assert settings["postgresql"]["parameters"]["shared_preload_libraries"] == "pg_stat_statements,pgaudit"
    patch = dynamic_config_patch(config_cm(BOOTSTRAPPED), settings)
    assert patch is not None
    assert changed_parameter_names(patch) == ["pgaudit.log", "shared_preload_libraries"]


def test_members_waiting_for_a_preload_restart_roll_replicas_first_then_the_primary_in_place() -> None:
    pods = [
        pod("db-0", "primary", pending=PRELOAD),
        pod("db-1", "replica", pending=PRELOAD),
        pod("db-2", "replica", pending=PRELOAD),
    ]
    first = plan_restart(instances_from_pods(pods, STREAMING), 3)
    assert (first.kind, first.target) == ("restart", "db-2")
    assert "shared_preload_libraries" in first.reason
    pods[2], pods[1] = pod("db-2", "replica"), pod("db-1", "replica")
    last = plan_restart(instances_from_pods(pods, STREAMING), 3)
    assert (last.kind, last.target) == ("restart", "db-0") and "in place" in last.reason
