"""pvc_resizes: grow the cluster's data PVCs to spec.storage, never shrink, touch nothing else."""

from __future__ import annotations

from typing import Any

from harness.objects import cluster_model
from pg_operator.specs import pvc_resizes


def pvc(name: str, storage: str | None, **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"requests": {"storage": storage}} if storage else {}}
    return {"metadata": {"name": name, "namespace": "shop", **meta}, "spec": spec}


def patch(size: str) -> dict[str, Any]:
    return {"spec": {"resources": {"requests": {"storage": size}}}}


def test_grows_only_smaller_data_pvcs() -> None:
    pvcs = [
        pvc("data-orders-db-1", "20Gi"),
        pvc("data-orders-db-0", "20Gi"),
        pvc("data-orders-db-2", "30Gi"),
    ]
    assert pvc_resizes(cluster_model(storage="30Gi"), pvcs) == [
        ("data-orders-db-0", patch("30Gi")),
        ("data-orders-db-1", patch("30Gi")),
    ]


def test_never_shrinks() -> None:
    assert pvc_resizes(cluster_model(storage="10Gi"), [pvc("data-orders-db-0", "20Gi")]) == []
    assert pvc_resizes(cluster_model(storage="20Gi"), [pvc("data-orders-db-0", "20Gi")]) == []


def test_compares_quantities_not_strings() -> None:
    # 21474836480 bytes is exactly 20Gi; 20G is less than 20Gi.
    assert pvc_resizes(cluster_model(storage="20Gi"), [pvc("data-orders-db-0", "21474836480")]) == []
    assert pvc_resizes(cluster_model(storage="20Gi"), [pvc("data-orders-db-0", "20G")]) == [
        ("data-orders-db-0", patch("20Gi"))
    ]
    assert pvc_resizes(cluster_model(storage="9Gi"), [pvc("data-orders-db-0", "10Gi")]) == []


def test_ignores_other_pvcs() -> None:
    others = [
        pvc("data-orders-db-archive", "1Gi"),
        pvc("data-orders-db2-0", "1Gi"),
        pvc("wal-orders-db-0", "1Gi"),
        pvc("data-orders-db-0", "1Gi", namespace="other"),
        pvc("data-orders-db-1", "1Gi", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    assert pvc_resizes(cluster_model(storage="30Gi"), others) == []


def test_pvc_without_a_request_is_grown() -> None:
    assert pvc_resizes(cluster_model(storage="5Gi"), [pvc("data-orders-db-0", None)]) == [
        ("data-orders-db-0", patch("5Gi"))
    ]
