"""What the lifecycle sub-reconciler makes of the status: an instance fenced on purpose does not make the
cluster Degraded, anything else not ready still does."""

from __future__ import annotations

from typing import Any

from pg_operator.controller.reconcilers.lifecycle import fenced_not_degraded


def computed(*unready: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    names = ("db-0", "db-1", "db-2")
    instances = [{"name": n, "ready": n not in unready} for n in names]
    status: dict[str, Any] = {"phase": "Degraded: InstancesNotReady", "instances": instances}
    degraded = {"type": "Degraded", "status": "True", "reason": "InstancesNotReady", "message": "2 of 3"}
    return status, [degraded]


def test_only_fenced_instances_not_ready_is_not_degraded() -> None:
    status, conditions = computed("db-2")
    fenced_not_degraded(status, conditions, frozenset({"db-2"}))
    assert conditions[0]["status"] == "False" and conditions[0]["reason"] == "Fenced"
    assert "db-2" in conditions[0]["message"] and status["phase"] == "Fenced"


def test_an_instance_not_ready_without_being_fenced_still_degrades() -> None:
    status, conditions = computed("db-1", "db-2")
    fenced_not_degraded(status, conditions, frozenset({"db-2"}))
    assert conditions[0]["status"] == "True" and conditions[0]["reason"] == "InstancesNotReady"
    assert status["phase"] == "Degraded: InstancesNotReady"
