"""The read side: a watch-fed cache of every kind the controller looks at, by cluster.

A reconcile reads a `Snapshot` assembled from this cache and never LISTs the API. The informers
(controller/informer.py) feed it through `Wakeups` (`Cache.observe`): each object is packed and let go at
once. Until every kind's first listing is in (`cache_sync.SyncGate`), nothing may act on it.

The cache holds each object as compact JSON, zlib-compressed against a dictionary of its kind
(`Packer`), decoded only into the snapshot of the cluster being reconciled: a parsed body costs 4-6 times
its JSON size in Python objects, and the cache holds every child of every cluster (about 28 objects per
cluster) for the life of the process. A decoded body is equal to the one the API server sent, so what a
reconcile sees is unchanged.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import BACKUP_KIND, BACKUP_PLURAL, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
from pg_operator.api.constants import API_VERSION, KIND, PLURAL
from pg_operator.controller.cache_admission import Admissions, Holding, SecretReads, stub
from pg_operator.controller.cache_sync import ListedKind, SyncGate
from pg_operator.controller.keys import ClusterKey, cluster_key_of_child, cluster_key_of_cluster
from pg_operator.orchestration.instance_pods import instance_pods
from pg_operator.orchestration.nodes import NodeView, node_view
from pg_operator.specs.status import SERVICE_NAME_LABEL, rw_service_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchedKind:
    """A child kind the cache holds by cluster."""

    api_version: str
    kind: str
    plural: str


POD = WatchedKind("v1", "Pod", "pods")
PVC = WatchedKind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SECRET = WatchedKind("v1", "Secret", "secrets")
# The endpointslice controller's slices of the cluster's Services (it copies the Service's labels, the
# cluster label among them): Ready waits for the -rw Service to route to the primary (specs/status.py).
ENDPOINT_SLICE = WatchedKind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")
ENDPOINT_SLICE_KIND = (ENDPOINT_SLICE.api_version, ENDPOINT_SLICE.kind)
SECRET_KIND = (SECRET.api_version, SECRET.kind)
POD_KIND = (POD.api_version, POD.kind)

# Plurals of the kinds `pg_operator.specs.MANAGED_KINDS` may name.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Secret"): "secrets",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("apps/v1", "StatefulSet"): "statefulsets",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ENDPOINT_SLICE_KIND: ENDPOINT_SLICE.plural,
}


def watched_kinds(managed: Iterable[tuple[str, str]]) -> list[WatchedKind]:
    """Every child kind the cache holds: the managed kinds plus Secrets, Pods, PVCs and EndpointSlices."""
    out: dict[tuple[str, str], WatchedKind] = {}
    observed = [("v1", "Secret"), ("v1", "Pod"), ("v1", "PersistentVolumeClaim"), ENDPOINT_SLICE_KIND]
    for api_version, kind in [*managed, *observed]:
        plural = PLURALS.get((api_version, kind))
        if plural is None:
            raise ValueError(
                f"MANAGED_KINDS names {api_version} {kind}, for which the controller has no plural"
            )
        out[(api_version, kind)] = WatchedKind(api_version, kind, plural)
    return list(out.values())


def routes_rw(endpoint_slice: Mapping[str, Any], key: ClusterKey) -> bool:
    """Whether an EndpointSlice is one of the cluster's `-rw` Service's."""
    return objects.label(endpoint_slice, SERVICE_NAME_LABEL) == rw_service_name(key[1])


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict copy of a watched object without managedFields (they are large and unused)."""
    out = {k: v for k, v in body.items()}
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


# zlib's fastest level; with a kind's dictionary it keeps a tenth to a quarter of the JSON (Secrets' base64
# keys excepted), and at 1000 clusters the cache holds about 28,000 objects for the life of the process.
_PACK_LEVEL = 1
_WINDOW = 32768  # zlib reads at most this much of a preset dictionary (its end)


class Packed(bytes):
    """One cached object, as its kind's `Packer` packed it."""

    __slots__ = ()


def _compact(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


# kubectl apply's copy of what it applied: for a Secret, its values again.
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _blank_data(body: Mapping[str, Any]) -> dict[str, Any]:
    """The slim body with every value under `data` and `stringData` emptied, the keys kept, and no copy
    of them in kubectl's last-applied annotation."""
    out = slim(body)
    for field_name in ("data", "stringData"):
        values = out.get(field_name)
        if isinstance(values, Mapping):
            out[field_name] = dict.fromkeys(values, "")
    annotations = out["metadata"].get("annotations")
    if isinstance(annotations, Mapping) and _LAST_APPLIED in annotations:
        out["metadata"]["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}
    return out


class Packer:
    """Packs the objects of one kind: the slim body as compact JSON, zlib-compressed with the first body
    it packed as a preset dictionary. Objects of one kind repeat most of their keys and many values
    across clusters (a StatefulSet's pod template, a pod's spec): with the dictionary a packed body is
    about what differs from that first one, 2.5 KB a cluster's children instead of 12 KB with zlib alone
    (Secrets aside, whose random keys compress little either way). Most then stay under the 512 bytes
    CPython serves from its own pools instead of the C heap, where the long-lived ones pinned pages.
    The dictionary is fixed once chosen: every packed value needs it to decode. `unpack()` gives a fresh
    dict every time, so a reconcile may not change what the cache holds. With `values_out` the dictionary
    is the first body with the values of its `data` and `stringData` blanked: a Secret's key material
    then lives only in that Secret's own packed value and leaves memory with it."""

    __slots__ = ("_values_out", "_zdict")

    def __init__(self, values_out: bool = False) -> None:
        self._values_out = values_out
        self._zdict: bytes | None = None

    def pack(self, body: Mapping[str, Any]) -> Packed:
        text = _compact(slim(body))
        if self._zdict is None:
            self._zdict = (_compact(_blank_data(body)) if self._values_out else text)[-_WINDOW:]
        compressor = zlib.compressobj(_PACK_LEVEL, zdict=self._zdict)
        return Packed(compressor.compress(text) + compressor.flush())

    def unpack(self, packed: Packed) -> dict[str, Any]:
        if self._zdict is None:
            raise ValueError("this packer has packed nothing, so it cannot unpack")
        decompressor = zlib.decompressobj(zdict=self._zdict)
        value = json.loads(decompressor.decompress(packed) + decompressor.flush())
        if not isinstance(value, dict):
            raise TypeError(f"a cached object decoded to {type(value).__name__}, not an object")
        return value


@dataclass
class Snapshot:
    """What a reconcile sees for one cluster, read from the cache."""

    cluster: dict[str, Any] | None
    children: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    storage_classes: frozenset[str] = frozenset()
    storage_classes_known: bool = False
    # Pods carrying the cluster's label that are none of its instances (orchestration/instance_pods.py):
    # never among the Pods above; named here for a Warning.
    foreign_pods: tuple[str, ...] = ()
    # Every Node, as orchestration/nodes.py reads it; None when the operator may not read Nodes (a
    # namespaced install without that grant) or its cache has not seen them all yet.
    nodes: tuple[NodeView, ...] | None = None

    def node(self, name: str) -> NodeView | None:
        return next((n for n in self.nodes or () if n.name == name), None)

    def of_kind(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        return self.children.get((api_version, kind), [])

    def find(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        for obj in self.of_kind(api_version, kind):
            if objects.name(obj) == name:
                return obj
        return None


def _uid(body: Mapping[str, Any]) -> str:
    return objects.uid(body)


def _version(body: Mapping[str, Any]) -> int:
    """An object's resourceVersion as a number, to tell the newer of two objects under one name."""
    rv = objects.resource_version(body) or ""
    return int(rv) if rv.isdigit() else -1


class _Store:
    """The objects of one kind, by the cluster they belong to; an object whose cluster changes (labels,
    owner) moves, one that belongs to none is dropped."""

    def __init__(self, values_out: bool = False) -> None:
        self.by_key: dict[Any, dict[str, Packed]] = {}
        self._key_of: dict[str, Any] = {}  # uid -> key
        self.packer = Packer(values_out)

    def put(self, uid: str, key: Any, body: Mapping[str, Any]) -> None:
        """File `body` under `key`; a key of None drops it."""
        old = self._key_of.get(uid)
        if old is not None and (old != key or key is None):
            self.remove(uid)
        if key is None:
            return
        self.by_key.setdefault(key, {})[uid] = self.packer.pack(body)
        self._key_of[uid] = key

    def remove(self, uid: str) -> None:
        key = self._key_of.pop(uid, None)
        if key is None:
            return
        objects = self.by_key.get(key, {})
        objects.pop(uid, None)
        if not objects:
            self.by_key.pop(key, None)

    def holds(self, uid: str) -> bool:
        return uid in self._key_of

    def values(self, key: Any) -> list[dict[str, Any]]:
        """The objects filed under `key`, decoded."""
        return [self.packer.unpack(p) for p in self.by_key.get(key, {}).values()]

    def __len__(self) -> int:
        return len(self._key_of)


CLUSTER_KIND = (API_VERSION, KIND)
STORAGE_CLASS_KIND = ("storage.k8s.io/v1", "StorageClass")
NODE_KIND = ("v1", "Node")
# The backup kinds, for the backup reconcilers: Backups by their cluster (namespace, spec.cluster),
# ScheduledBackups by (namespace, name). Not awaited by the sync gate: a missing backup CRD must not
# keep the operator from syncing (its informers only warn about it).
BACKUP_KIND_KEY = (API_VERSION, BACKUP_KIND)
SCHEDULED_BACKUP_KIND_KEY = (API_VERSION, SCHEDULED_BACKUP_KIND)


CLUSTERS = ListedKind(CLUSTER_KIND[0], CLUSTER_KIND[1], PLURAL)
STORAGE_CLASSES = ListedKind(STORAGE_CLASS_KIND[0], STORAGE_CLASS_KIND[1], "storageclasses", namespaced=False)
NODES = ListedKind(NODE_KIND[0], NODE_KIND[1], "nodes", namespaced=False)
BACKUPS = ListedKind(API_VERSION, BACKUP_KIND, BACKUP_PLURAL)
SCHEDULED_BACKUPS = ListedKind(API_VERSION, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL)


# Secrets per page of a listing: a tenant's labelled Secrets may be up to 1 MiB each, and a page is read
# whole before the cache drops what it does not keep.
SECRET_PAGE_SIZE = 20


def child_kinds(kinds: list[WatchedKind], child_label: str) -> list[ListedKind]:
    """The child kinds as they are listed and watched: only objects carrying `child_label`, selected by
    the API server, so every other Pod, Secret, ConfigMap … of the watched namespaces stays out of this
    process."""
    return [ListedKind(k.api_version, k.kind, k.plural, label_selector=child_label,
                       page_size=SECRET_PAGE_SIZE if k == SECRET else None) for k in kinds]  # fmt: skip


class Cache:
    """Every watched object, packed, by cluster; fed one watch event at a time (`observe`)."""

    def __init__(self, kinds: list[WatchedKind], gate: SyncGate | None = None) -> None:
        self.kinds = kinds
        # Secrets' values stay out of their kind's dictionary (Packer).
        self._stores: dict[tuple[str, str], _Store] = {
            (k.api_version, k.kind): _Store(values_out=k == SECRET) for k in kinds
        }
        self._stores[CLUSTER_KIND] = _Store()
        self._stores[STORAGE_CLASS_KIND] = _Store()
        self._stores[BACKUP_KIND_KEY] = _Store()
        self._stores[SCHEDULED_BACKUP_KIND_KEY] = _Store()
        # Open once every kind's first listing is in (None: a cache filled by hand, in tests).
        self.gate = gate
        # False when the operator may not read StorageClasses (a namespaced install): none are watched, so
        # a snapshot never claims to know them (reconcilers/storage.py skips its check).
        self.storage_classes_readable = True
        # Nodes, kept as NodeViews by name (not packed: a few fields each, and every snapshot shares one
        # tuple of them, made again only when a node's view changes). False: the operator may not read
        # Nodes, and no snapshot claims to know them (no drain handling, specs/pdb.py).
        self.nodes_readable = True
        self._nodes: dict[str, NodeView] = {}
        self._node_uids: dict[str, str] = {}  # name -> uid, to prune by a listing's uids
        self._node_tuple: tuple[NodeView, ...] = ()
        # What is kept of the labelled Secrets, ConfigMaps, Pods and PVCs (cache_admission.py).
        self.admissions = Admissions()

    @property
    def synced(self) -> bool:
        return self.gate is None or self.gate.open

    def observe(self, body: Mapping[str, Any], event_type: str | None) -> bool:
        """One watch event (None for an object of a listing). False when the object is none of the
        cache's: a labelled object a reconcile does not read (cache_admission.py), an unwatched kind."""
        api_version, kind = str(body.get("apiVersion") or ""), str(body.get("kind") or "")
        store = self._stores.get((api_version, kind))
        uid = _uid(body)
        if (api_version, kind) == NODE_KIND:
            return self._observe_node(body, event_type)
        if store is None or not uid:
            return False
        if event_type == "DELETED":
            held = store.holds(uid)
            store.remove(uid)
            if (api_version, kind) == CLUSTER_KIND:
                self.admissions.cluster_gone(cluster_key_of_cluster(body))
            else:
                self.admissions.forget(body, cluster_key_of_child(body))
            return held
        if (api_version, kind) == CLUSTER_KIND:
            key = cluster_key_of_cluster(body)
            store.put(uid, key, body)
            reads = self.admissions.cluster_seen(body, key)
            if reads is not None:
                self._refile_secrets(key, reads)
            return True
        if (api_version, kind) == STORAGE_CLASS_KIND:
            store.put(uid, objects.name(body), body)
        elif (api_version, kind) == BACKUP_KIND_KEY:
            cluster = str((body.get("spec") or {}).get("cluster") or "")
            store.put(uid, (cluster_key_of_cluster(body)[0], cluster) if cluster else None, body)
        elif (api_version, kind) == SCHEDULED_BACKUP_KIND_KEY:
            store.put(uid, cluster_key_of_cluster(body), body)
        else:
            return self._observe_child(store, uid, body)
        return True

    def _observe_node(self, body: Mapping[str, Any], event_type: str | None) -> bool:
        """A Node event: True when what the operator reads of the node changed (a heartbeat does not) in a
        way the clusters on it must see. A node first seen Ready and not draining (every node of a first
        listing, or one just joined) has no instance on it yet: nothing to wake."""
        name = objects.name(body)
        if event_type == "DELETED":
            changed = self._nodes.pop(name, None) is not None
            self._node_uids.pop(name, None)
        else:
            self._node_uids[name] = _uid(body)
            view = node_view(body)
            before = self._nodes.get(name)
            changed = before != view
            self._nodes[name] = view
            if before is None and view.ready is True and not view.draining:
                self._node_tuple = tuple(self._nodes[n] for n in sorted(self._nodes))
                return False
        if changed:
            self._node_tuple = tuple(self._nodes[n] for n in sorted(self._nodes))
        return changed

    def node(self, name: str) -> NodeView | None:
        return self._nodes.get(name)

    def prune_nodes(self, keep: set[str]) -> set[str]:
        """Drop the nodes a new listing did not hold (`keep`: its uids); the names dropped."""
        gone = {name for name, uid in self._node_uids.items() if uid not in keep}
        for name in gone:
            self._nodes.pop(name, None)
            self._node_uids.pop(name, None)
        if gone:
            self._node_tuple = tuple(self._nodes[n] for n in sorted(self._nodes))
        return gone

    def _observe_child(self, store: _Store, uid: str, body: Mapping[str, Any]) -> bool:
        key = cluster_key_of_child(body)
        if key is not None and body.get("kind") == ENDPOINT_SLICE.kind and not routes_rw(body, key):
            key = None  # only the -rw Service's slices are read; the others are not held
        held = self.admissions.judge(body, key) if key is not None else Holding.DROPPED
        if held is Holding.DROPPED:
            store.put(uid, None, body)  # and gone if it was held before
            return False
        store.put(uid, key, stub(body) if held is Holding.STUB else body)
        return True

    def _refile_secrets(self, key: ClusterKey, reads: SecretReads) -> None:
        """The cluster now reads other Secrets: those held that it no longer reads become stubs or go;
        those it reads that were left out are to be read by name (`take_unread`)."""
        store = self._stores.get(SECRET_KIND)
        if store is None:
            return
        whole, stubbed = set(), set()
        for uid, packed in list(store.by_key.get(key, {}).items()):
            body = store.packer.unpack(packed)
            name = objects.name(body)
            if uid in self.admissions.stubs:
                stubbed.add(name)
                continue
            held = self.admissions.judge(body, key)
            if held is Holding.WHOLE:
                whole.add(name)
            elif held is Holding.STUB:
                store.put(uid, key, stub(body))
                stubbed.add(name)
            else:
                store.put(uid, None, body)
        self.admissions.secrets_refiled(key, reads, whole, stubbed)

    def take_unread(self, key: ClusterKey) -> frozenset[str]:
        """The Secrets the cluster came to read that the cache left out: to be read by name, once."""
        return self.admissions.take_unread(key)

    def holds_whole(self, body: Mapping[str, Any]) -> bool:
        """Whether the cache holds this object (by uid) whole, not as a stub."""
        store = self._stores.get((str(body.get("apiVersion") or ""), str(body.get("kind") or "")))
        uid = _uid(body)
        return store is not None and store.holds(uid) and uid not in self.admissions.stubs

    def prune(self, kind: tuple[str, str], keep: set[str], namespace: str | None = None) -> list[ClusterKey]:
        """Drop every object of `kind` (in `namespace`; None: anywhere) whose uid is not in `keep` (what a
        new listing held): the clusters they belonged to."""
        store = self._stores.get(kind)
        if store is None:
            return []
        dropped = [(uid, key) for key, objects in store.by_key.items()
                   if namespace is None or (isinstance(key, tuple) and key[0] == namespace)
                   for uid in objects if uid not in keep]  # fmt: skip
        for uid, _ in dropped:
            store.remove(uid)
        if kind == STORAGE_CLASS_KIND:
            return []  # keyed by name, not by cluster; a cluster that used one notices at its resync
        return sorted({key for _, key in dropped})

    def _unpacked(self, kind: tuple[str, str], key: Any) -> list[dict[str, Any]]:
        return self._stores[kind].values(key)

    def cluster_keys(self) -> list[ClusterKey]:
        return list(self._stores[CLUSTER_KIND].by_key)

    def cluster(self, key: ClusterKey) -> dict[str, Any] | None:
        found = self._stores[CLUSTER_KIND].values(key)
        if not found:
            return None
        # Two only if a deleted cluster's DELETED event were to trail its successor's ADDED: the newer
        # one is the cluster.
        return max(found, key=_version) if len(found) > 1 else found[0]

    def backups(self, key: ClusterKey) -> list[dict[str, Any]]:
        """The Backups of one cluster."""
        return self._unpacked(BACKUP_KIND_KEY, key)

    def scheduled_backup(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """A ScheduledBackup by (namespace, name); the newer while a recreated one's DELETED trails."""
        found = self._stores[SCHEDULED_BACKUP_KIND_KEY].values(key)
        return max(found, key=_version) if found else None

    def storage_classes(self) -> frozenset[str]:
        return frozenset(self._stores[STORAGE_CLASS_KIND].by_key)

    def size(self, api_version: str, kind: str) -> int:
        return len(self._stores[(api_version, kind)])

    def pods_held(self, key: ClusterKey) -> list[dict[str, Any]]:
        """Every pod the cache holds for the cluster, whatever controls it now (the snapshot's are only
        those its StatefulSet controls). A deleted cluster's store finalizer deletes the StatefulSet, then
        must wait for its pods to stop: they archive their last WAL on the way down."""
        return self._unpacked(POD_KIND, key) if POD_KIND in self._stores else []

    def snapshot(self, key: ClusterKey) -> Snapshot:
        cluster = self.cluster(key)
        children = {(k.api_version, k.kind): self._unpacked((k.api_version, k.kind), key) for k in self.kinds}
        foreign = self.admissions.foreign_pods(key)
        if POD_KIND in children:
            # Only the pods the cluster's own StatefulSet controls are its instances: every sub-reconciler,
            # the status and each exec or Patroni call read them here (orchestration/instance_pods.py).
            statefulset = next((s for s in children.get(("apps/v1", "StatefulSet"), ())
                                if objects.name(s) == key[1]), None)  # fmt: skip
            split = instance_pods(children[POD_KIND], statefulset, objects.uid(cluster))
            children[POD_KIND] = list(split.ours)
            foreign.update(split.foreign)
        known = self.synced and self.storage_classes_readable
        nodes = self._node_tuple if self.synced and self.nodes_readable else None
        return Snapshot(
            cluster,
            children,
            self.storage_classes() if known else frozenset(),
            known,
            tuple(sorted(foreign)),
            nodes,
        )
