"""Pods, StatefulSets and Patroni ConfigMaps as the watch cache holds them, for the pure planners and the
status: an instance pod with Patroni's role label and its container's state, one with the cluster and
revision labels, a StatefulSet's size and revision, and Patroni's leader key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

OLD_IMAGE, NEW_IMAGE = "localhost/pg-operator/postgres:16.13", "localhost/pg-operator/postgres:16.15"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def instance_pod(
    name: str,
    role: str = "replica",
    image: str = OLD_IMAGE,
    ready: bool = True,
    *,
    terminating: bool = False,
    container: str = "running",
    restarts: int = 0,
    age: timedelta = timedelta(hours=1),
) -> dict[str, Any]:
    """A pod as the planners read it: role label, image, readiness and the database container's state."""
    state: dict[str, Any] = {container: {}}
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"role": role} if role else {},
        "creationTimestamp": (NOW - age).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if terminating:
        meta["deletionTimestamp"] = NOW.isoformat()
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "postgres", "image": image}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "postgres", "state": state, "restartCount": restarts}]},
    }  # fmt: skip


def leader_cm(holder: str | None, rv: str = "42") -> dict[str, Any]:
    """Patroni's `<scope>-leader` ConfigMap (scope db), held by `holder` or by nobody."""
    annotations = {"leader": holder, "ttl": "12"} if holder else {"ttl": "12"}
    return {"metadata": {"name": "db-leader", "resourceVersion": rv, "annotations": annotations}}


def cluster_pod(
    i: int, role: str | None = "replica", ready: bool = True, rev: str = "rev1", **meta: Any
) -> dict[str, Any]:
    """Pod `orders-db-<i>` with the cluster and controller-revision labels, as the status reads it."""
    labels = {"db.example.com/cluster": "orders-db", "controller-revision-hash": rev}
    if role is not None:
        labels["role"] = role
    return {
        "metadata": {"name": f"orders-db-{i}", "labels": labels, **meta},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def statefulset(replicas: int = 3, update_revision: str = "rev1") -> dict[str, Any]:
    return {"spec": {"replicas": replicas}, "status": {"updateRevision": update_revision}}
