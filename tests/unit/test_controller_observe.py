"""The read cache: packed index values decode to exactly the slim body, snapshots are built from them, and
the child watches ask the API server for labelled objects only."""

from __future__ import annotations

import copy
from typing import Any

import kopf

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.observe import (
    CLUSTER_INDEX,
    STORAGECLASS_INDEX,
    Cache,
    Packed,
    index_child,
    index_cluster,
    slim,
    watched_kinds,
)
from pg_operator.controller.operator import kopf_settings
from pg_operator.specs import MANAGED_KINDS

CLUSTER_REF = {
    "apiVersion": "db.example.com/v1alpha1",
    "kind": "PostgresCluster",
    "name": "db",
    "uid": "u1",
    "controller": True,
}


def pod(name: str, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {CLUSTER_LABEL: "db", "role": "primary"},
            "annotations": {"status": '{"conn_url":"postgres://10.0.0.1:5432/postgres"}', "ünï": "cödé"},
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
            "resourceVersion": "42",
        },
        "spec": {"containers": [{"name": "postgres", "image": "pg:16", "ports": [{"containerPort": 5432}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "restartCount": 0, "ready": True, **status},
    }


def test_packed_value_decodes_to_the_slim_body_and_drops_managed_fields() -> None:
    body = pod("db-0")
    packed = Packed.of(body)
    assert packed.unpack() == slim(body)
    assert "managedFields" not in packed.unpack()["metadata"]
    assert packed.unpack()["metadata"]["annotations"]["ünï"] == "cödé"
    assert len(packed) < len(repr(slim(body)))  # compact separators, no spaces


def test_unpacked_bodies_are_fresh_copies() -> None:
    packed = Packed.of(pod("db-0"))
    first = packed.unpack()
    first["status"]["phase"] = "Failed"
    first["metadata"]["labels"].clear()
    assert packed.unpack()["status"]["phase"] == "Running"
    assert packed.unpack()["metadata"]["labels"] == {CLUSTER_LABEL: "db", "role": "primary"}


def test_equal_bodies_pack_equal_so_kopf_skips_rewriting_the_index() -> None:
    a, b = pod("db-0"), copy.deepcopy(pod("db-0"))
    assert Packed.of(a) == Packed.of(b)
    b["status"]["podIP"] = "10.0.0.2"
    assert Packed.of(a) != Packed.of(b)


def test_index_functions_key_children_by_cluster_and_skip_strangers() -> None:
    owned_sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": "shop", "ownerReferences": [CLUSTER_REF]},
        "spec": {"replicas": 3},
    }
    assert {k: v.unpack() for k, v in index_child(owned_sts).items()} == {("shop", "db"): slim(owned_sts)}
    stranger = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", "namespace": "shop"}}
    assert index_child(stranger) == {}
    cluster = {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
               "metadata": {"name": "db", "namespace": "shop"}, "spec": {"replicas": 3}}
    assert index_cluster(cluster)[("shop", "db")].unpack() == cluster


def test_snapshot_decodes_what_the_indexes_hold() -> None:
    kinds = watched_kinds(MANAGED_KINDS)
    pod_kind = next(k for k in kinds if k.kind == "Pod")
    cluster = {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
               "metadata": {"name": "db", "namespace": "shop"}, "spec": {"replicas": 2}}
    pods = [pod("db-0"), pod("db-1", phase="Pending")]
    key = ("shop", "db")
    cache = Cache(kinds)
    cache.bind({
        CLUSTER_INDEX: {key: [Packed.of(cluster)]},
        pod_kind.index_id: {key: [Packed.of(p) for p in pods]},
        STORAGECLASS_INDEX: {"standard": [True]},
        "unrelated_kwarg": 1,
    })
    snap = cache.snapshot(key)
    assert snap.cluster == cluster
    assert snap.of_kind("v1", "Pod") == [slim(p) for p in pods]
    found = snap.find("v1", "Pod", "db-1")
    assert found is not None and found["status"]["phase"] == "Pending"
    assert snap.of_kind("apps/v1", "StatefulSet") == []
    assert snap.storage_classes == frozenset({"standard"}) and snap.storage_classes_known
    assert cache.cluster_keys() == [key]
    assert cache.snapshot(("shop", "other")).cluster is None


def _resource(group: str, version: str, plural: str, kind: str) -> kopf.Resource:
    return kopf.Resource(group, version, plural, kind=kind, namespaced=True, preferred=True)


def test_child_watches_select_labelled_objects_server_side_and_only_those() -> None:
    settings = kopf_settings()
    selectors = settings.watching.label_selectors
    for api_version, kind in [*MANAGED_KINDS, ("v1", "Pod"), ("v1", "PersistentVolumeClaim")]:
        group, _, version = api_version.rpartition("/")
        plural = next(k.plural for k in watched_kinds(MANAGED_KINDS) if k.kind == kind)
        assert selectors.collect(_resource(group, version, plural, kind)) == [CLUSTER_LABEL], kind
    # The clusters themselves and the StorageClasses are not labelled: they must be seen unfiltered.
    clusters = _resource("db.example.com", "v1alpha1", "postgresclusters", "PostgresCluster")
    assert selectors.collect(clusters) == []
    assert selectors.collect(_resource("storage.k8s.io", "v1", "storageclasses", "StorageClass")) == []
    assert selectors.collect(_resource("", "v1", "events", "Event")) == []
