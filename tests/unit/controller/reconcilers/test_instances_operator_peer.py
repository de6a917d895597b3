"""Where the instances sub-reconciler says the operator's connections come from (the NetworkPolicy's operator
peer): its namespace, and the node addresses it adds when it runs outside the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from reconciler_fakes import RecordedEvents

from pg_operator.controller.reconcilers import instances


def test_operator_namespace_from_the_pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "db-operators")
    assert instances.operator_namespace() == "db-operators"


def test_operator_namespace_defaults_to_the_shipped_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(instances, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    assert instances.operator_namespace() == "pg-operator-system"
    (tmp_path / "ns").write_text("ops\n")
    monkeypatch.setattr(instances, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "ns")
    assert instances.operator_namespace() == "ops"


def test_in_cluster_is_told_by_the_service_host_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not instances.runs_in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert instances.runs_in_cluster()


def test_instance_host_ips_prefers_host_ips_and_skips_pending_pods() -> None:
    pods: list[dict[str, Any]] = [
        {"status": {"hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}},
        {"status": {"hostIP": "10.0.0.2"}},
        {"status": {}},  # Pending: not scheduled yet
        {},
    ]
    assert instances.instance_host_ips(pods) == ["10.0.0.1", "fd00::1", "10.0.0.2"]


def test_a_tenants_look_alike_pods_are_named_in_one_warning_posted_once_per_set() -> None:
    import asyncio

    from harness.objects import cluster_model
    from pg_operator.controller.cache import Snapshot
    from pg_operator.controller.reconcilers import ReconcileContext

    events = RecordedEvents()
    reconciler = instances.InstancesReconciler(events, in_cluster=True)  # type: ignore[arg-type]

    def follow_up(foreign: tuple[str, ...]) -> int:
        ctx = ReconcileContext({"metadata": {"name": "orders-db", "namespace": "shop"}}, cluster_model(),
                        Snapshot(None, foreign_pods=foreign), None)  # fmt: skip
        return asyncio.run(reconciler.follow_up(ctx))

    assert follow_up(("fake-primary",)) == 1 and follow_up(("fake-primary",)) == 0  # once per set
    kind, reason, message = events.posted[0]
    assert (kind, reason) == ("Warning", "ForeignPod")
    assert "pod fake-primary carries the cluster's labels but is not controlled by its StatefulSet" in message
    assert follow_up(("fake-primary", "fake-replica")) == 1 and "fake-replica" in events.posted[1][2]
    assert follow_up(()) == 0 and follow_up(("fake-primary",)) == 1  # gone, then back: said again
