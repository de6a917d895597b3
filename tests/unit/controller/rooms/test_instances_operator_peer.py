"""Where the instances room says the operator's connections come from (the NetworkPolicy's operator
peer): its namespace, and the node addresses it adds when it runs outside the cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pg_operator.controller.rooms import instances


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
