"""The read cache: packed values decode to exactly the slim body, watch events file each object under its
cluster (and move or drop it when that changes), snapshots are built from them, and the child watches
ask the API server for labelled objects only."""

from __future__ import annotations

import base64
import json
import secrets
import zlib
from typing import Any

import pytest

from pg_operator.api.constants import CLUSTER_LABEL
from pg_operator.controller.cache import CLUSTER_KIND, Cache, Packer, slim, watched_kinds
from pg_operator.controller.cache_sync import SyncGate
from pg_operator.controller.loop import ReconcileLoop, Result
from pg_operator.controller.wakeups import Wakeups, feeds
from pg_operator.specs import MANAGED_KINDS

CLUSTER_REF = {
    "apiVersion": "db.example.com/v1alpha1",
    "kind": "PostgresCluster",
    "name": "db",
    "uid": "u1",
    "controller": True,
}


# The cluster's StatefulSet (statefulset() below): its pods are the cluster's instances.
STATEFULSET_REF = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s1",
                   "controller": True}  # fmt: skip


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
            "uid": f"uid-{name}",
            "ownerReferences": [STATEFULSET_REF],
        },
        "spec": {"containers": [{"name": "postgres", "image": "pg:16", "ports": [{"containerPort": 5432}]}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "restartCount": 0, "ready": True, **status},
    }


def test_packed_value_decodes_to_the_slim_body_and_drops_managed_fields() -> None:
    body = pod("db-0")
    packer = Packer()
    packed = packer.pack(body)
    assert packer.unpack(packed) == slim(body)
    assert "managedFields" not in packer.unpack(packed)["metadata"]
    assert packer.unpack(packed)["metadata"]["annotations"]["ünï"] == "cödé"
    assert len(packed) < len(repr(slim(body)))


def test_later_bodies_of_a_kind_pack_against_the_first_and_decode_exactly() -> None:
    packer = Packer()
    first = packer.pack(pod("db-0"))
    others = {name: pod(name, podIP=f"10.0.0.{i}") for i, name in enumerate(["db-1", "db-2", "other-0"])}
    packed = {name: packer.pack(body) for name, body in others.items()}
    for name, body in others.items():
        assert packer.unpack(packed[name]) == slim(body)
        # the dictionary holds what the first pod shares with the others: a fraction of zlib alone
        assert len(packed[name]) < len(zlib.compress(json.dumps(slim(body)).encode(), 1)) / 2
    assert packer.unpack(first) == slim(pod("db-0"))


def secret(name: str, key: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}",
                         "labels": {CLUSTER_LABEL: "db"}},
            "data": {"tls.key": key, "tls.crt": key[::-1]}}  # fmt: skip


def test_a_values_out_packer_keeps_no_value_of_the_first_secret_past_its_own_packed_value() -> None:
    first_key = base64.b64encode(secrets.token_bytes(96)).decode()
    applied = secret("db-tls", first_key)
    applied["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps({"data": applied["data"]}),
        "a": "b",
    }
    packer = Packer(values_out=True)
    first = packer.pack(applied)
    later = packer.pack(secret("other-tls", base64.b64encode(secrets.token_bytes(96)).decode()))
    assert packer.unpack(first) == slim(applied)
    assert packer.unpack(later)["metadata"]["name"] == "other-tls"
    zdict = packer._zdict or b""
    assert b"db-tls" in zdict and b"tls.key" in zdict  # the shape is still shared
    assert first_key.encode() not in zdict and first_key[::-1].encode() not in zdict
    # without values_out the first Secret's key would be the dictionary
    plain = Packer()
    plain.pack(secret("db-tls", first_key))
    assert first_key.encode() in (plain._zdict or b"")


def test_the_cache_packs_secrets_with_their_values_out_of_the_dictionary() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    key = base64.b64encode(secrets.token_bytes(96)).decode()
    cache.observe(secret("db-server-tls", key), "ADDED")  # one the cluster reads (cache_admission.py)
    packer = cache._stores[("v1", "Secret")].packer
    assert packer._zdict and key.encode() not in packer._zdict
    found = cache.snapshot(("shop", "db")).find("v1", "Secret", "db-server-tls")
    assert found == slim(secret("db-server-tls", key))


def test_a_packer_that_packed_nothing_refuses_to_unpack() -> None:
    with pytest.raises(ValueError, match="packed nothing"):
        Packer().unpack(Packer().pack(pod("db-0")))


def test_unpacked_bodies_are_fresh_copies() -> None:
    packer = Packer()
    packed = packer.pack(pod("db-0"))
    first = packer.unpack(packed)
    first["status"]["phase"] = "Failed"
    first["metadata"]["labels"].clear()
    assert packer.unpack(packed)["status"]["phase"] == "Running"
    assert packer.unpack(packed)["metadata"]["labels"] == {CLUSTER_LABEL: "db", "role": "primary"}


def cluster_body(name: str = "db", uid: str = "u1", rv: str = "1", replicas: int = 2) -> dict[str, Any]:
    return {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": "shop", "uid": uid, "resourceVersion": rv},
            "spec": {"replicas": replicas, "version": "16", "storage": "1Gi"}}  # fmt: skip


def statefulset(owner: str | None = "db") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "db", "namespace": "shop", "uid": "s1"}
    if owner:
        meta["ownerReferences"] = [{**CLUSTER_REF, "name": owner}]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": {"replicas": 3}}


def new_cache() -> Cache:
    return Cache(watched_kinds(MANAGED_KINDS))


def test_events_file_children_under_their_cluster_and_a_snapshot_decodes_them() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    for body in (pod("db-0"), pod("db-1", phase="Pending"), statefulset()):
        cache.observe(body, None)
    key = ("shop", "db")
    snap = cache.snapshot(key)
    assert snap.cluster == cluster_body()
    assert snap.of_kind("v1", "Pod") == [slim(pod("db-0")), slim(pod("db-1", phase="Pending"))]
    found = snap.find("v1", "Pod", "db-1")
    assert found is not None and found["status"]["phase"] == "Pending"
    assert snap.find("apps/v1", "StatefulSet", "db") == statefulset()
    assert cache.cluster_keys() == [key]
    assert cache.snapshot(("shop", "other")).cluster is None
    assert cache.snapshot(("shop", "other")).of_kind("v1", "Pod") == []


def test_a_modified_object_replaces_its_packed_value_and_deleted_removes_it() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    cache.observe(statefulset(), None)
    cache.observe(pod("db-0"), None)
    cache.observe(pod("db-0", phase="Failed"), "MODIFIED")
    assert [p["status"]["phase"] for p in cache.snapshot(("shop", "db")).of_kind("v1", "Pod")] == ["Failed"]
    cache.observe(pod("db-0", phase="Failed"), "DELETED")
    assert cache.snapshot(("shop", "db")).of_kind("v1", "Pod") == []
    assert cache.size("v1", "Pod") == 0


def test_an_object_that_changes_cluster_moves_and_one_that_belongs_to_none_is_dropped() -> None:
    cache = new_cache()
    cache.observe(statefulset("db"), None)
    cache.observe(statefulset("other"), "MODIFIED")
    assert cache.snapshot(("shop", "db")).of_kind("apps/v1", "StatefulSet") == []
    assert len(cache.snapshot(("shop", "other")).of_kind("apps/v1", "StatefulSet")) == 1
    stranger = statefulset(None)  # no owner, no label: not ours
    cache.observe(stranger, "MODIFIED")
    assert cache.snapshot(("shop", "other")).of_kind("apps/v1", "StatefulSet") == []
    assert cache.size("apps/v1", "StatefulSet") == 0
    # Kinds the cache does not hold, and objects without a uid, are ignored.
    cache.observe({"apiVersion": "v1", "kind": "Event", "metadata": {"uid": "e", "namespace": "shop"}}, None)
    cache.observe({**pod("db-9"), "metadata": {"name": "db-9", "namespace": "shop"}}, None)
    assert cache.size("v1", "Pod") == 0


def test_a_recreated_cluster_survives_its_predecessors_late_deleted_event() -> None:
    cache = new_cache()
    old, new = cluster_body(uid="old", rv="5", replicas=1), cluster_body(uid="new", rv="9", replicas=3)
    cache.observe(old, None)
    cache.observe(new, "ADDED")  # should a DELETED ever trail its successor's ADDED
    assert cache.cluster(("shop", "db")) == new
    cache.observe(old, "DELETED")
    assert cache.cluster(("shop", "db")) == new
    cache.observe(new, "DELETED")
    assert cache.cluster(("shop", "db")) is None and cache.cluster_keys() == []


class Nothing:
    async def reconcile(self, key: Any) -> Result:
        return Result()


def wakeups_over(cache: Cache) -> Wakeups:
    return Wakeups(ReconcileLoop(Nothing()), cache)


def test_storage_classes_are_known_only_once_the_cache_has_synced() -> None:
    kinds = watched_kinds(MANAGED_KINDS)
    gate = SyncGate()
    cache = Cache(kinds, gate)
    wakeups = wakeups_over(cache)
    every = feeds(wakeups, kinds)
    gate.expect((f.kind.key, None) for f in every if f.awaited)
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
          "metadata": {"name": "fast", "uid": "sc1"}}  # fmt: skip
    cache.observe(sc, None)
    assert not cache.synced and not cache.snapshot(("shop", "db")).storage_classes_known
    for feed in every:
        wakeups.listed(feed, None, {"sc1"} if feed.kind.kind == "StorageClass" else set(), True)
    assert cache.synced
    snap = cache.snapshot(("shop", "db"))
    assert snap.storage_classes_known and snap.storage_classes == frozenset({"fast"})
    cache.observe(sc, "DELETED")
    assert cache.storage_classes() == frozenset()


def test_the_feeds_watch_every_kind_the_cache_holds_the_children_by_their_label_only() -> None:
    kinds = watched_kinds(MANAGED_KINDS)
    every = {f.kind.key: f for f in feeds(wakeups_over(Cache(kinds)), kinds)}
    assert set(every) == {CLUSTER_KIND, ("storage.k8s.io/v1", "StorageClass"), ("v1", "Node")} | {
        (k.api_version, k.kind) for k in kinds
    }
    observed = [("v1", "Pod"), ("v1", "PersistentVolumeClaim"), ("v1", "Secret")]
    for api_version, kind in [*MANAGED_KINDS, *observed]:
        assert every[(api_version, kind)].kind.params() == {"labelSelector": CLUSTER_LABEL}, kind
    # The clusters themselves and the StorageClasses are not labelled: they must be seen unfiltered.
    assert every[CLUSTER_KIND].kind.params() == {}
    assert every[("storage.k8s.io/v1", "StorageClass")].kind.params() == {}
    assert all(f.awaited for f in every.values())
    pods = every[("v1", "Pod")].kind
    assert every[("apps/v1", "StatefulSet")].kind.path("shop") == "/apis/apps/v1/namespaces/shop/statefulsets"
    assert pods.path("shop", "db-0") == "/api/v1/namespaces/shop/pods/db-0"
    assert pods.path() == "/api/v1/pods"
    assert pods.namespaces(["a", "b"]) == ["a", "b"] and pods.namespaces([]) == [None]
    storage_classes = every[("storage.k8s.io/v1", "StorageClass")].kind
    assert storage_classes.path("shop") == "/apis/storage.k8s.io/v1/storageclasses"  # cluster-scoped
    assert storage_classes.namespaces(["a", "b"]) == [None]
    assert ("storage.k8s.io/v1", "StorageClass") not in {
        f.kind.key for f in feeds(wakeups_over(Cache(kinds)), kinds, storage_classes=False)
    }
    assert every[("v1", "Node")].kind.params() == {} and every[("v1", "Node")].kind.path() == "/api/v1/nodes"
    assert ("v1", "Node") not in {f.kind.key for f in feeds(wakeups_over(Cache(kinds)), kinds, nodes=False)}


def test_a_relisting_drops_what_it_did_not_show_in_its_namespace_and_wakes_those_clusters() -> None:
    kinds = watched_kinds(MANAGED_KINDS)
    cache = Cache(kinds, SyncGate([]))
    wakeups = wakeups_over(cache)
    pods = next(f for f in feeds(wakeups, kinds) if f.kind.key == ("v1", "Pod"))
    other = {**pod("db-0"), "metadata": {**pod("db-0")["metadata"], "namespace": "else", "uid": "uid-else"}}
    for body in (pod("db-0"), pod("db-1"), other, cluster_body(), statefulset()):
        cache.observe(body, "ADDED")
    wakeups.listed(pods, "shop", {"uid-db-0"}, False)
    assert [p["metadata"]["name"] for p in cache.snapshot(("shop", "db")).of_kind("v1", "Pod")] == ["db-0"]
    assert cache.size("v1", "Pod") == 2  # another namespace's listing keeps its own
    assert len(wakeups.controller.queue) == 1  # ("shop", "db"): its pass will see db-1 gone
    assert cache.prune(CLUSTER_KIND, set()) == [("shop", "db")] and cache.cluster_keys() == []
    assert cache.prune(("v1", "Pod"), {"uid-db-0"}, "shop") == []
    assert cache.prune(("v1", "Pod"), set()) == [("else", "db"), ("shop", "db")]


def endpoint_slice(service: str, uid: str, *pods: str, ready: bool = True) -> dict[str, Any]:
    """As the endpointslice controller writes it: the Service's labels copied, owned by the Service."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-abcde", "namespace": "shop", "uid": uid,
            "labels": {CLUSTER_LABEL: "db", "kubernetes.io/service-name": service,
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": f"svc-{uid}",
                                 "controller": True}],
        },
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": ready},
                       "targetRef": {"kind": "Pod", "name": p}} for p in pods],
    }  # fmt: skip


def test_the_rw_services_endpoint_slices_are_held_by_cluster_and_the_others_not() -> None:
    kinds = watched_kinds(MANAGED_KINDS)
    assert ("discovery.k8s.io/v1", "EndpointSlice", "endpointslices") in {
        (k.api_version, k.kind, k.plural) for k in kinds
    }
    gate = SyncGate([(("discovery.k8s.io/v1", "EndpointSlice"), None)])
    cache = Cache(kinds, gate)
    for body in (endpoint_slice("db-rw", "e1", "db-0"), endpoint_slice("db-ro", "e2", "db-1"),
                 endpoint_slice("db", "e3", "db-0", "db-1")):  # fmt: skip
        cache.observe(body, None)
    gate.listed(("discovery.k8s.io/v1", "EndpointSlice"))
    assert gate.open
    held = cache.snapshot(("shop", "db")).of_kind("discovery.k8s.io/v1", "EndpointSlice")
    assert [s["metadata"]["name"] for s in held] == ["db-rw-abcde"]
    cache.observe(endpoint_slice("db-rw", "e1", "db-0"), "DELETED")
    assert cache.snapshot(("shop", "db")).of_kind("discovery.k8s.io/v1", "EndpointSlice") == []
