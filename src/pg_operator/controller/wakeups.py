"""What each watched object means: it goes into the read cache and wakes the cluster it belongs to (or a
backup reconciler); `feeds` names every kind the informers list and watch, with who takes its objects."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_LABEL
from pg_operator.controller.backup_reconcilers.loops import BackupLoops
from pg_operator.controller.cache import (
    BACKUPS,
    CLUSTERS,
    NODES,
    SCHEDULED_BACKUPS,
    SECRET_KIND,
    STORAGE_CLASSES,
    Cache,
    WatchedKind,
    child_kinds,
    routes_rw,
)
from pg_operator.controller.informer import Feed
from pg_operator.controller.keys import (
    ClusterKey,
    cluster_key_of_child,
    cluster_key_of_cluster,
    owning_cluster_name,
)
from pg_operator.controller.loop import ReconcileLoop
from pg_operator.controller.nodes import pods_on
from pg_operator.controller.secret_reads import Read, SecretReader
from pg_operator.orchestration.instances import loaded_tls, pending_restart_settings
from pg_operator.orchestration.stuck_pods import stuck_signature

log = logging.getLogger(__name__)


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
        # A container the kubelet reports failing (image pull, crash loop), a pod the scheduler refuses:
        # the status says why the pod is stuck (orchestration/stuck_pods.py).
        stuck_signature(body),
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
        self,
        controller: ReconcileLoop[ClusterKey],
        cache: Cache,
        backups: BackupLoops | None = None,
        read_secret: Read | None = None,
    ) -> None:
        self.controller = controller
        self.cache = cache
        self.backups = backups  # the backup reconcilers' own loops (controller/backup_reconcilers)
        # Reads by name the Secrets a cluster came to read after the cache left them out (none in tests
        # that fill the cache by hand).
        self.secret_reader = SecretReader(read_secret, self.on_read_secret) if read_secret else None
        # The hash of each pod's, PVC's and -rw slice's last fingerprint, not the tuple: 7 per cluster,
        # kept for the life of the process (an equal hash for a changed fingerprint would only defer the
        # wake-up to the next event or resync).
        self._seen: dict[str, int] = {}

    def listed(self, feed: Feed, namespace: str | None, uids: set[str], first: bool) -> None:
        """A complete listing of a kind: what the cache holds of it beyond that listing is gone (deleted
        while no watch was there to say so), and the clusters it belonged to are woken; the first
        listing of each kind is what the sync gate waits for."""
        kind = feed.kind.key
        if kind == NODES.key:
            gone = self.cache.prune_nodes(uids)
            for name in sorted(gone):
                log.info("node %s: gone while the watch was down", name)
                self._wake_clusters_on(name)
            if self.cache.gate is not None:
                self.cache.gate.listed(kind, namespace)
            return
        woken = self.cache.prune(kind, uids, namespace)
        if woken:
            log.info("cache: %s of %d cluster(s) gone while the watch was down; waking them",
                     feed.kind.name, len(woken))  # fmt: skip
        for key in woken:
            self.controller.wake(key)
        if self.cache.gate is not None:
            self.cache.gate.listed(kind, namespace)

    def on_cluster(self, body: Mapping[str, Any], event_type: str | None) -> None:
        self.cache.observe(body, event_type)
        key = cluster_key_of_cluster(body)
        unread = self.cache.take_unread(key)
        if unread and self.secret_reader is not None:
            # The reconcile comes once the Secrets the spec now names are in (or known missing): woken at
            # once, it would report a Secret the cluster names as not there, then take it back.
            self.secret_reader.read(key, unread, then=lambda: self.controller.wake(key))
        else:
            self.controller.wake(key)
        if self.backups is not None:
            self.backups.on_cluster(body)

    def on_child(self, body: Mapping[str, Any], event_type: str | None) -> None:
        held = self.cache.observe(body, event_type)
        key = cluster_key_of_child(body)
        if key is None:
            return
        kind = body.get("kind")
        if not held:
            # A labelled object no reconcile reads (cache_admission.py) wakes nobody: a tenant's junk costs
            # no reconcile. A pod or PVC the cache held before (its controller changed) wakes its cluster
            # once.
            was_held = self._seen.pop(objects.uid(body), None) is not None
            if kind in ("Pod", "PersistentVolumeClaim") and was_held:
                self.controller.wake_soon(key)
            return
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
            # own in place of a credential Secret: its password is to be applied (reconcilers/credentials.py).
            return
        elif kind == "StatefulSet" and event_type == "MODIFIED":
            self.controller.wake_soon(key)  # mostly its status moving; our own applies come back here too
            return
        self.controller.wake(key)

    def on_read_secret(self, body: dict[str, Any]) -> None:
        """A Secret read by name (secret_reads.py): taken as a watch event unless the watch already
        brought it (its copy is then at least as new)."""
        if not self.cache.holds_whole(body):
            self.on_child(body, "MODIFIED")

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

    def on_node(self, body: Mapping[str, Any], event_type: str | None) -> None:
        """A node cordoned, tainted, relabelled, changing readiness or deleted wakes the clusters with a pod
        on it (a drain of the primary's node: reconcilers/drains.py; a lost node: reconcilers/node_loss.py);
        a heartbeat changes nothing read."""
        if not self.cache.observe(body, event_type):
            return
        name = objects.name(body)
        view = self.cache.node(name)
        if view is None or view.lost:
            log.info("node %s: %s", name, "gone" if view is None else view.readiness.value)
        self._wake_clusters_on(name)

    def _wake_clusters_on(self, node: str) -> None:
        for key in self.cache.cluster_keys():
            if pods_on(self.cache.pods_held(key), node):
                self.controller.wake(key)


def feeds(
    wakeups: Wakeups, kinds: list[WatchedKind], *, storage_classes: bool = True, nodes: bool = True
) -> list[Feed]:
    """Every kind the informers list and watch: the clusters, their children (those carrying the cluster
    label), the StorageClasses (`storage_classes`: False when the operator may not read them,
    reconcilers/storage.py), the Nodes (`nodes`: likewise; controller/nodes.py) and, for the backup
    reconcilers, Backups and ScheduledBackups, whose CRDs may be missing: the sync gate does not wait for
    those."""
    out = [Feed(CLUSTERS, wakeups.on_cluster)]
    out += [Feed(kind, wakeups.on_child, after=CLUSTERS.key if kind.key == SECRET_KIND else None)
            for kind in child_kinds(kinds, CLUSTER_LABEL)]  # fmt: skip
    if storage_classes:
        out.append(Feed(STORAGE_CLASSES, wakeups.on_storage_class))
    if nodes:
        out.append(Feed(NODES, wakeups.on_node))
    if wakeups.backups is not None:
        out.append(Feed(BACKUPS, wakeups.on_backup, awaited=False))
        out.append(Feed(SCHEDULED_BACKUPS, wakeups.on_scheduled_backup, awaited=False))
    return out
