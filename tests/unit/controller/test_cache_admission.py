"""What the watch cache keeps of labelled objects: whole only under the names a reconcile reads, a stub of
the cluster's other own objects, nothing of a tenant's junk; and a Secret left out is read by name once
the cluster comes to read it."""

from __future__ import annotations

import base64
import os
from typing import Any

from pg_operator.controller.cache import Cache, watched_kinds
from pg_operator.controller.cache_admission import (
    MAX_DROPPED_NAMES,
    Holding,
    holding,
    secret_reads,
    stub,
)
from pg_operator.specs import MANAGED_KINDS

LABEL = "db.example.com/cluster"
KEY = ("shop", "db")
CLUSTER_REF = {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster", "name": "db", "uid": "u1",
               "controller": True}  # fmt: skip


def cluster_body(generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1", "generation": generation},
            "spec": {"replicas": 1, "version": "16", "storage": "1Gi", **spec}}  # fmt: skip


def obj(kind: str, name: str, *, owned: bool = False, size: int = 64) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "shop", "uid": f"uid-{name}", "resourceVersion": "7",
                            "labels": {LABEL: "db", "junk": "x" * 60},
                            "annotations": {"big": "y" * size}}  # fmt: skip
    if owned:
        meta["ownerReferences"] = [CLUSTER_REF]
    body = {"apiVersion": "v1", "kind": kind, "metadata": meta}
    if kind in ("Secret", "ConfigMap"):
        body["data"] = {"blob": base64.b64encode(os.urandom(size)).decode()}
    return body


def test_a_cluster_reads_its_own_secrets_and_those_its_spec_names() -> None:
    reads = secret_reads(cluster_body(
        tls={"caSecret": "my-ca"},
        roles=[{"name": "alice", "login": True}, {"name": "bob", "login": True,
                                                  "passwordSecret": {"name": "bob-pw"}}],
    ))  # fmt: skip
    assert {"db-superuser", "db-replication", "db-app", "db-patroni-api", "db-ca", "db-server-tls",
            "db-pooler-auth", "my-ca", "bob-pw", "db-alice"} <= reads.names  # fmt: skip
    assert "db-bob" not in reads.names  # bob's password comes from the Secret he names
    store = {"bucket": "backups", "endpointURL": "https://s3.example", "credentials": {"secretName": "x"}}
    restored = secret_reads(cluster_body(
        backup={"s3": {**store, "credentials": {"secretName": "own-s3"}}},
        bootstrap={"recovery": {"source": {"clusterName": "old-db",
                                           "s3": {**store, "credentials": {"secretName": "old-s3"}}}}},
    ))  # fmt: skip
    assert {"own-s3", "old-s3"} <= restored.names  # its own store, and the source's a restore reads
    imported = secret_reads(cluster_body(bootstrap={"import": {
        "source": {"host": "old-db", "user": "reader", "passwordSecret": {"name": "old-reader"},
                   "sslMode": "require"}, "databases": ["shop"]}}))  # fmt: skip
    assert "old-reader" in imported.names  # the import's source password: its label is checked
    assert secret_reads({"metadata": {"name": "db"}, "spec": {"replicas": "many"}}).names == frozenset()


def test_labelled_objects_are_held_whole_only_under_a_read_name() -> None:
    reads = secret_reads(cluster_body())
    assert holding(obj("Secret", "db-app"), KEY, reads) is Holding.WHOLE
    assert holding(obj("Secret", "db-app"), KEY, None) is Holding.DROPPED  # the cluster not known yet
    assert holding(obj("Secret", "junk-1"), KEY, reads) is Holding.DROPPED
    assert holding(obj("Secret", "db-old-role", owned=True), KEY, reads) is Holding.STUB
    assert holding(obj("ConfigMap", "db-leader"), KEY, None) is Holding.WHOLE
    assert holding(obj("ConfigMap", "db-instance"), KEY, None) is Holding.WHOLE
    assert holding(obj("ConfigMap", "junk"), KEY, None) is Holding.DROPPED
    assert holding(obj("PersistentVolumeClaim", "data-db-4"), KEY, None) is Holding.WHOLE
    assert holding(obj("PersistentVolumeClaim", "data-db-5"), KEY, None) is Holding.DROPPED
    assert holding(obj("PersistentVolumeClaim", "junk", owned=True), KEY, None) is Holding.STUB
    assert holding(obj("Service", "whatever"), KEY, None) is Holding.WHOLE  # children are read by name


def test_a_stub_keeps_identity_and_the_operators_labels_only() -> None:
    body = obj("Secret", "db-old-role", owned=True, size=100_000)
    body["metadata"]["labels"]["db.example.com/role"] = "old"
    small = stub(body)
    assert small["metadata"]["name"] == "db-old-role" and small["metadata"]["uid"] == "uid-db-old-role"
    assert small["metadata"]["ownerReferences"] == [CLUSTER_REF]
    assert small["metadata"]["labels"] == {LABEL: "db", "db.example.com/role": "old"}
    assert "data" not in small and "annotations" not in small["metadata"]
    assert len(repr(small)) < 1000


def new_cache() -> Cache:
    return Cache(watched_kinds(MANAGED_KINDS))


def test_a_tenants_labelled_junk_is_not_held() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    held = [cache.observe(obj("Secret", f"junk-{i}", size=300_000), "ADDED") for i in range(20)]
    assert held == [False] * 20
    assert cache.size("v1", "Secret") == 0
    assert cache.observe(obj("Secret", "db-app"), "ADDED")
    assert [s["metadata"]["name"] for s in cache.snapshot(KEY).of_kind("v1", "Secret")] == ["db-app"]
    # Forged controller references cost a stub each, not their data.
    for i in range(20):
        cache.observe(obj("Secret", f"forged-{i}", owned=True, size=300_000), "ADDED")
    packed = sum(len(p) for p in cache._stores[("v1", "Secret")].by_key[KEY].values())
    assert packed < 20 * 1000 + 2000


def test_a_secret_left_out_is_read_by_name_once_the_spec_names_it() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    cache.observe(obj("Secret", "bob-pw"), "ADDED")  # made first, named afterwards
    assert cache.size("v1", "Secret") == 0 and cache.take_unread(KEY) == frozenset()
    bob = {"name": "bob", "login": True, "passwordSecret": {"name": "bob-pw"}}
    cache.observe(cluster_body(2, roles=[bob]), "MODIFIED")
    assert cache.take_unread(KEY) == {"bob-pw"}
    assert cache.take_unread(KEY) == frozenset()  # once
    # Read by name, it is held and kept fresh by the watch.
    cache.observe(obj("Secret", "bob-pw"), "MODIFIED")
    assert cache.snapshot(KEY).find("v1", "Secret", "bob-pw") is not None
    # No longer named: let go.
    cache.observe(cluster_body(3), "MODIFIED")
    assert cache.snapshot(KEY).find("v1", "Secret", "bob-pw") is None
    # A status write (same generation) parses nothing again and reads nothing.
    cache.observe(cluster_body(3), "MODIFIED")
    assert cache.take_unread(KEY) == frozenset()


def test_an_owned_secret_held_as_a_stub_is_read_whole_when_it_is_read_again() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    cache.observe(obj("Secret", "db-alice", owned=True), "ADDED")  # a role not declared (yet)
    found = cache.snapshot(KEY).find("v1", "Secret", "db-alice")
    assert found is not None and "data" not in found
    assert not cache.holds_whole(obj("Secret", "db-alice"))
    cache.observe(cluster_body(2, roles=[{"name": "alice", "login": True}]), "MODIFIED")
    assert cache.take_unread(KEY) == {"db-alice"}
    cache.observe(obj("Secret", "db-alice", owned=True), "MODIFIED")
    assert cache.holds_whole(obj("Secret", "db-alice"))


def test_past_the_remembered_names_every_newly_read_secret_is_read() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    for i in range(MAX_DROPPED_NAMES + 5):
        cache.observe(obj("Secret", f"junk-{i}"), "ADDED")
    cache.observe(cluster_body(2, tls={"caSecret": "my-ca"}), "MODIFIED")
    unread = cache.take_unread(KEY)
    assert "my-ca" in unread


def sts_pod(name: str, sts_uid: str = "s1") -> dict[str, Any]:
    body = obj("Pod", name)
    body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                                            "uid": sts_uid, "controller": True}]  # fmt: skip
    return body


def test_a_snapshot_lists_only_the_pods_of_the_clusters_own_statefulset() -> None:
    cache = new_cache()
    cache.observe(cluster_body(), None)
    meta = {"name": "db", "namespace": "shop", "uid": "s1", "ownerReferences": [CLUSTER_REF]}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta}
    cache.observe(sts, None)
    assert cache.observe(sts_pod("db-0"), "ADDED")
    assert not cache.observe(obj("Pod", "a-imposter"), "ADDED")  # no controller: not even held
    assert cache.observe(sts_pod("db-1", sts_uid="forged"), "ADDED")  # held, but not the cluster's
    snap = cache.snapshot(KEY)
    assert [p["metadata"]["name"] for p in snap.of_kind("v1", "Pod")] == ["db-0"]
    assert snap.foreign_pods == ("a-imposter", "db-1")
    cache.observe(obj("Pod", "a-imposter"), "DELETED")
    assert cache.snapshot(KEY).foreign_pods == ("db-1",)
    # The StatefulSet deleted (a store finalizer's first step): no instance is left, yet its pods are
    # still held while they stop, and the finalizer waits for them.
    cache.observe(sts, "DELETED")
    assert cache.snapshot(KEY).of_kind("v1", "Pod") == []
    assert sorted(p["metadata"]["name"] for p in cache.pods_held(KEY)) == ["db-0", "db-1"]
