"""The read side: kopf indexes (watch-fed caches) of every kind the controller looks at, by cluster.

A reconcile reads a `Snapshot` assembled from these indexes and never LISTs the API.

The indexes hold each object as compact JSON (`Packed`), decoded only into the snapshot of the cluster
being reconciled: a parsed body costs 4-6 times its JSON size in Python objects, and the indexes hold
every child of every cluster (about 20 objects per cluster) for the life of the process. A decoded body
is equal to the one kopf handed to the index, so what a reconcile sees is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pg_operator.controller.keys import ClusterKey, cluster_key_of_child, cluster_key_of_cluster


@dataclass(frozen=True)
class WatchedKind:
    """A kind we index by cluster. `index_id` names the kopf index."""

    api_version: str
    kind: str
    plural: str
    index_id: str

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0] if "/" in self.api_version else ""

    @property
    def version(self) -> str:
        return self.api_version.split("/")[-1]


def _index_id(api_version: str, kind: str) -> str:
    return "idx_" + (api_version.replace("/", "_").replace(".", "_") + "_" + kind).lower()


def watched_kind(api_version: str, kind: str, plural: str) -> WatchedKind:
    return WatchedKind(api_version, kind, plural, _index_id(api_version, kind))


POD = watched_kind("v1", "Pod", "pods")
PVC = watched_kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SECRET = watched_kind("v1", "Secret", "secrets")
CLUSTER_INDEX = "idx_postgresclusters"
STORAGECLASS_INDEX = "idx_storageclasses"

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
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
}


def watched_kinds(managed: Iterable[tuple[str, str]]) -> list[WatchedKind]:
    """Every child kind to index: the managed kinds plus Secrets, Pods and PVCs."""
    out: dict[tuple[str, str], WatchedKind] = {}
    for api_version, kind in [*managed, ("v1", "Secret"), ("v1", "Pod"), ("v1", "PersistentVolumeClaim")]:
        plural = PLURALS.get((api_version, kind))
        if plural is None:
            raise ValueError(
                f"MANAGED_KINDS names {api_version} {kind}, for which the controller has no plural"
            )
        out[(api_version, kind)] = watched_kind(api_version, kind, plural)
    return list(out.values())


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict copy of a watched object without managedFields (they are large and unused)."""
    out = {k: v for k, v in body.items()}
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


class Packed(bytes):
    """One indexed object: its slim body as compact JSON. `unpack()` gives a fresh dict every time, so
    a reconcile may not change what the index holds."""

    __slots__ = ()

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Packed:
        return cls(json.dumps(slim(body), separators=(",", ":"), ensure_ascii=False).encode())

    def unpack(self) -> dict[str, Any]:
        value = json.loads(self)
        if not isinstance(value, dict):
            raise TypeError(f"an indexed object decoded to {type(value).__name__}, not an object")
        return value


def unpack(value: Any) -> dict[str, Any]:
    """An index value as a dict (tolerates plain dicts, e.g. in tests that fill a Snapshot directly)."""
    return value.unpack() if isinstance(value, Packed) else dict(value)


def index_child(body: Mapping[str, Any]) -> dict[ClusterKey, Packed]:
    key = cluster_key_of_child(body)
    return {key: Packed.of(body)} if key else {}


def index_cluster(body: Mapping[str, Any]) -> dict[ClusterKey, Packed]:
    return {cluster_key_of_cluster(body): Packed.of(body)}


@dataclass
class Snapshot:
    """What a reconcile sees for one cluster, read from the indexes."""

    cluster: dict[str, Any] | None
    children: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    storage_classes: frozenset[str] = frozenset()
    storage_classes_known: bool = False

    def of_kind(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        return self.children.get((api_version, kind), [])

    def find(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        for obj in self.of_kind(api_version, kind):
            if (obj.get("metadata") or {}).get("name") == name:
                return obj
        return None


class Cache:
    """Holds the kopf indexes (live objects) once kopf hands them to a handler."""

    def __init__(self, kinds: list[WatchedKind]) -> None:
        self.kinds = kinds
        self._indices: Mapping[str, Any] | None = None

    def bind(self, handler_kwargs: Mapping[str, Any]) -> None:
        if self._indices is None and CLUSTER_INDEX in handler_kwargs:
            self._indices = {k: v for k, v in handler_kwargs.items() if k.startswith("idx_")}

    @property
    def ready(self) -> bool:
        return self._indices is not None

    def _store(self, index_id: str, key: Any) -> list[dict[str, Any]]:
        if self._indices is None:
            return []
        index = self._indices.get(index_id)
        if index is None or key not in index:
            return []
        return [unpack(v) for v in index[key]]

    def cluster_keys(self) -> list[ClusterKey]:
        if self._indices is None:
            return []
        return list(self._indices[CLUSTER_INDEX])

    def cluster(self, key: ClusterKey) -> dict[str, Any] | None:
        found = self._store(CLUSTER_INDEX, key)
        return found[0] if found else None

    def snapshot(self, key: ClusterKey) -> Snapshot:
        children = {(k.api_version, k.kind): self._store(k.index_id, key) for k in self.kinds}
        known = self._indices is not None and STORAGECLASS_INDEX in self._indices
        classes = frozenset(self._indices[STORAGECLASS_INDEX]) if known and self._indices else frozenset()
        return Snapshot(self.cluster(key), children, classes, known)
