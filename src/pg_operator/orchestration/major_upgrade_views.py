"""The cluster as the other sub-reconcilers must build it while a major upgrade runs (docs/major-upgrades.md).

The data runs the major in the StatefulSet's `PGOP_PG_MAJOR`; until the upgrade has moved the data, the
reconcile's cluster is replaced by one at the running major and image, so no pod is ever started with a newer
major's binaries on older data; from the new major's start on, by one at the new major and the image the
upgrade checked. Backups follow the generation the held major archives to.

Pure: may import `api`, `objects`; never `specs` or `controller`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pg_operator import objects
from pg_operator.api.cluster import PostgresCluster


def _postgres_container(statefulset: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    containers = (objects.spec(statefulset).get("template") or {}).get("spec", {}).get("containers") or ()
    return next((c for c in containers if c.get("name") == "postgres"), None)


def running_major(statefulset: Mapping[str, Any] | None) -> str | None:
    """The major the data runs: the StatefulSet's PGOP_PG_MAJOR (None before the StatefulSet exists)."""
    for env in (_postgres_container(statefulset) or {}).get("env") or ():
        if env.get("name") == "PGOP_PG_MAJOR":
            return str(env.get("value"))
    return None


def running_image(statefulset: Mapping[str, Any] | None) -> str | None:
    """The image the StatefulSet runs PostgreSQL with (None before it exists)."""
    image = (_postgres_container(statefulset) or {}).get("image")
    return str(image) if image else None


def at_major(cluster: PostgresCluster, major: str, image: str | None = None) -> PostgresCluster:
    """The cluster as the other sub-reconcilers must build it while the data is on `major`, with `image`
    (None: the major's default image)."""
    if cluster.spec.version == major and cluster.spec.image == image:
        return cluster
    spec = cluster.spec.model_copy(update={"version": major, "image": image})
    return cluster.model_copy(update={"spec": spec})


def with_archive_server(cluster: PostgresCluster, server: str) -> PostgresCluster:
    """The cluster as its children must be built while it archives to backup generation `server`."""
    backup = cluster.spec.backup
    if backup is None or (backup.generation_server_name or cluster.name) == server:
        return cluster
    spec = cluster.spec.model_copy(
        update={"backup": backup.model_copy(update={"generation_server_name": server})}
    )
    return cluster.model_copy(update={"spec": spec})


def with_recovery_server(cluster: PostgresCluster, server: str) -> PostgresCluster:
    """The cluster as its children must be built when it restores from generation `server` of its
    source's backups."""
    recovery = cluster.spec.bootstrap.recovery
    if recovery is None or (recovery.source.generation_server_name or recovery.source.cluster_name) == server:
        return cluster
    source = recovery.source.model_copy(update={"generation_server_name": server})
    bootstrap = cluster.spec.bootstrap.model_copy(
        update={"recovery": recovery.model_copy(update={"source": source})}
    )
    return cluster.model_copy(update={"spec": cluster.spec.model_copy(update={"bootstrap": bootstrap})})
