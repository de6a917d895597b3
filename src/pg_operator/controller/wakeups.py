"""The kopf side: event handlers that feed the read cache and wake clusters, in a registry of our own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from pg_operator import objects
from pg_operator.api.backup import BACKUP_PLURAL, SCHEDULED_BACKUP_PLURAL
from pg_operator.api.constants import CLUSTER_LABEL, GROUP, PLURAL, ROLE_LABEL, VERSION
from pg_operator.controller.backup_reconcilers.loops import BackupLoops
from pg_operator.controller.cache import Cache, WatchedKind, routes_rw
from pg_operator.controller.keys import (
    ClusterKey,
    cluster_key_of_child,
    cluster_key_of_cluster,
    owning_cluster_name,
)
from pg_operator.controller.kopf_diffbase import change_detecting_handlers
from pg_operator.controller.kube_api import kopf_login
from pg_operator.controller.loop import ReconcileLoop
from pg_operator.orchestration.instances import loaded_tls, pending_restart_settings


def relevance(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """The part of a pod or PVC that status, resizing and restarts depend on; other changes (Patroni's
    annotations every loop) do not wake the cluster."""
    status = objects.status(body)
    if body.get("kind") == "PersistentVolumeClaim":
        return (
            str(((objects.spec(body).get("resources") or {}).get("requests") or {}).get("storage")),
            status.get("phase"),
            str((status.get("capacity") or {}).get("storage")),
            objects.deleting(body),
        )
    return (
        status.get("phase"),
        objects.condition_status(status, "Ready"),
        objects.label(body, ROLE_LABEL),
        objects.deleting(body),
        status.get("podIP"),
        # A settings change waiting for a restart of this instance (orchestration.rollout.plan_restart).
        pending_restart_settings(objects.meta(body)),
        # The TLS files the instance says it loaded: a CA rotation waits on it (specs/ca_rotation.py).
        loaded_tls(objects.meta(body)),
    )


def routing(endpoint_slice: Mapping[str, Any]) -> tuple[Any, ...]:
    """The part of an EndpointSlice Ready depends on: which pods it lists, ready or not, with an
    address or not (specs/status.routes_to)."""
    endpoints = sorted(
        (
            str((e.get("targetRef") or {}).get("kind")),
            str((e.get("targetRef") or {}).get("name")),
            (e.get("conditions") or {}).get("ready", True) is not False,
            bool(e.get("addresses")),
        )
        for e in endpoint_slice.get("endpoints") or ()
    )
    return (*endpoints, objects.deleting(endpoint_slice))


class Wakeups:
    """Maps every watched event to the cluster to reconcile, filtering noise from pods and PVCs."""

    def __init__(
        self, controller: ReconcileLoop[ClusterKey], cache: Cache, backups: BackupLoops | None = None
    ) -> None:
        self.controller = controller
        self.cache = cache
        self.backups = backups  # the backup reconcilers' own loops (controller/backup_reconcilers)
        # The hash of each pod's, PVC's and -rw slice's last fingerprint, not the tuple: 7 per cluster,
        # kept for the life of the process (an equal hash for a changed fingerprint would only defer the
        # wake-up to the next event or resync).
        self._seen: dict[str, int] = {}

    def on_cluster(self, body: Mapping[str, Any], event_type: str | None) -> None:
        self.cache.observe(body, event_type)
        self.controller.wake(cluster_key_of_cluster(body))
        if self.backups is not None:
            self.backups.on_cluster(body)

    def on_child(self, body: Mapping[str, Any], event_type: str | None) -> None:
        self.cache.observe(body, event_type)
        key = cluster_key_of_child(body)
        if key is None:
            return
        kind = body.get("kind")
        if kind == "EndpointSlice":
            self._on_endpoint_slice(body, event_type, key)
            return
        if kind in ("Pod", "PersistentVolumeClaim"):
            uid = objects.uid(body)
            if event_type == "DELETED":
                self._seen.pop(uid, None)
            else:
                fingerprint = hash(relevance(body))
                if self._seen.get(uid) == fingerprint:
                    return
                self._seen[uid] = fingerprint
            if event_type != "DELETED":
                self.controller.wake_soon(key)
                return
        elif owning_cluster_name(body) is None and kind != "Secret":
            # Labelled but not ours (e.g. Patroni's own ConfigMaps). A labelled Secret may be the user's
            # own in place of a credential Secret: its password is to be applied (rooms/credentials.py).
            return
        elif kind == "StatefulSet" and event_type == "MODIFIED":
            self.controller.wake_soon(key)  # mostly its status moving; our own applies come back here too
            return
        self.controller.wake(key)

    def _on_endpoint_slice(self, body: Mapping[str, Any], event_type: str | None, key: ClusterKey) -> None:
        """The -rw Service's slices decide Ready; the other Services' slices wake nobody."""
        if not routes_rw(body, key):
            return
        uid = objects.uid(body)
        if event_type == "DELETED":
            self._seen.pop(uid, None)
        else:
            fingerprint = hash(routing(body))
            if self._seen.get(uid) == fingerprint:
                return
            self._seen[uid] = fingerprint
        self.controller.wake_soon(key)

    def on_backup(self, body: Mapping[str, Any], event_type: str | None) -> None:
        self.cache.observe(body, event_type)
        if self.backups is not None:
            self.backups.on_backup(body, event_type)

    def on_scheduled_backup(self, body: Mapping[str, Any], event_type: str | None) -> None:
        self.cache.observe(body, event_type)
        if self.backups is not None:
            self.backups.on_scheduled_backup(body, event_type)

    def on_storage_class(self, body: Mapping[str, Any], event_type: str | None) -> None:
        self.cache.observe(body, event_type)
        name = objects.name(body)
        for key in self.cache.cluster_keys():
            cluster = self.cache.cluster(key) or {}
            if objects.spec(cluster).get("storageClassName") == name:
                self.controller.wake(key)


def build_registry(
    wakeups: Wakeups, kinds: list[WatchedKind], *, storage_classes: bool = True
) -> kopf.OperatorRegistry:
    """`storage_classes`: False when the operator may not read them (rooms/storage.py): no watch of them."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf_login)
    labelled = {CLUSTER_LABEL: kopf.PRESENT}

    # Coroutines, not plain functions: kopf runs a plain handler in its thread pool, a hop to a thread
    # and back for every watch event (≈ 12 % of the operator's CPU at 150 clusters, profiled).
    async def cluster_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        wakeups.on_cluster(body, type)

    async def child_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        wakeups.on_child(body, type)

    async def storage_class_event(body: kopf.Body, type: str | None, **_: Any) -> None:
        wakeups.on_storage_class(body, type)

    kopf.on.event(GROUP, VERSION, PLURAL, id="wake_cluster", registry=registry)(cluster_event)
    for kind in kinds:
        kopf.on.event(
            kind.group, kind.version, kind.plural, id=kind.handler_id, labels=labelled, registry=registry
        )(child_event)
    if wakeups.backups is not None:
        # Backups and ScheduledBackups go to the cache and the backup reconcilers only; a missing CRD
        # leaves kopf warning that the resource is unresolved, the rest of the operator unaffected.

        async def backup_event(body: kopf.Body, type: str | None, **_: Any) -> None:
            wakeups.on_backup(body, type)

        async def scheduled_backup_event(body: kopf.Body, type: str | None, **_: Any) -> None:
            wakeups.on_scheduled_backup(body, type)

        kopf.on.event(GROUP, VERSION, BACKUP_PLURAL, id="wake_backup", registry=registry)(backup_event)
        kopf.on.event(GROUP, VERSION, SCHEDULED_BACKUP_PLURAL, id="wake_scheduledbackup", registry=registry)(
            scheduled_backup_event
        )
    if storage_classes:
        kopf.on.event("storage.k8s.io", "v1", "storageclasses", id="wake_storageclass", registry=registry)(
            storage_class_event
        )
    # kopf_settings() gives kopf an empty diff base, which only a registry without these can afford.
    unexpected = change_detecting_handlers(registry)
    if unexpected:
        raise RuntimeError(f"handlers {unexpected} need kopf's diff base; the operator's settings drop it")
    # A kopf index would hold every listed object's worker until all are indexed (cache.py's docstring).
    indexes = [h.id for h in registry._indexing.get_all_handlers()]
    if indexes:
        raise RuntimeError(f"kopf indexes {indexes} are registered; the operator's cache replaces them")
    return registry
