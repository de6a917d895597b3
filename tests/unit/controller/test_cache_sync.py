"""The sync gate: open only once every object the operator listed has come through the watch, or was
found gone; the listing and the straggler lookups against a reader that holds plain dicts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from pg_operator.controller.backoff import Backoff
from pg_operator.controller.cache_sync import ListedKind, RelistPruner, SyncGate, sync

PODS = ListedKind("v1", "Pod", "pods", label_selector="app.kubernetes.io/instance")
CLUSTERS = ListedKind("db.example.com/v1alpha1", "PostgresCluster", "postgresclusters")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_when_every_listed_object_was_seen_in_any_order() -> None:
    gate = SyncGate([PODS.key, CLUSTERS.key])
    gate.saw(PODS.key, "p1")  # before the operator's own listing: remembered
    gate.listed(PODS.key, {"p1": ("shop", "db-0"), "p2": ("shop", "db-1")})
    gate.listed(CLUSTERS.key, {"c1": ("shop", "db")})
    assert not gate.open and gate.waiting_for() == {PODS.key: 1, CLUSTERS.key: 1}
    gate.saw(PODS.key, "p2")
    gate.saw(PODS.key, "p3")  # created after the listing: not awaited
    assert not gate.open
    gate.saw(CLUSTERS.key, "c1")
    assert gate.open and gate.waiting_for() == {}


def test_stays_closed_while_a_kind_is_unlisted_even_with_everything_seen() -> None:
    gate = SyncGate([PODS.key, CLUSTERS.key])
    gate.listed(PODS.key, {})
    gate.saw(CLUSTERS.key, "c1")
    assert not gate.open and gate.waiting_for() == {CLUSTERS.key: -1}
    gate.listed(CLUSTERS.key, {"c1": ("shop", "db")})
    assert gate.open


def test_an_object_struck_off_as_gone_counts_and_stalls_are_per_kind() -> None:
    clock = Clock()
    gate = SyncGate([PODS.key, CLUSTERS.key], clock=clock)
    gate.listed(PODS.key, {"p1": ("shop", "db-0"), "p2": ("shop", "db-1")})
    gate.listed(CLUSTERS.key, {"c1": ("shop", "db")})
    clock.now += 6
    gate.saw(PODS.key, "p1")  # progress for pods only
    clock.now += 5
    assert gate.stalled(10) == {CLUSTERS.key: {"c1": ("shop", "db")}}
    clock.now += 5
    assert set(gate.stalled(10)) == {PODS.key, CLUSTERS.key}
    gate.gone(PODS.key, "p2")
    gate.gone(CLUSTERS.key, "c1")
    assert gate.open


def test_a_gate_over_no_kinds_is_open_and_an_open_gate_ignores_news() -> None:
    gate = SyncGate([])
    assert gate.open
    gate.saw(PODS.key, "p1")
    gate.listed(PODS.key, {"p1": ("shop", "db-0")})
    assert gate.open and gate.waiting_for() == {}


class Reader:
    """Objects by list path, filtered by the label (presence) and name selectors as the API server would."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]], page: int = 2) -> None:
        self.objects = objects
        self.page = page
        self.list_calls: list[tuple[str, dict[str, str]]] = []
        self.lookups: list[str] = []
        self.fail_lists = 0

    async def list_metadata(
        self, path: str, params: Mapping[str, str]
    ) -> AsyncIterator[list[dict[str, Any]]]:
        self.list_calls.append((path, dict(params)))
        if self.fail_lists:
            self.fail_lists -= 1
            raise RuntimeError("HTTP 500")
        items = self.objects.get(path, [])
        label = params.get("labelSelector")
        if label:
            items = [m for m in items if label in m["labels"]]
        by_name = params.get("fieldSelector", "").removeprefix("metadata.name=")
        if by_name:
            self.lookups.append(by_name)
            items = [m for m in items if m["name"] == by_name]
        for start in range(0, max(len(items), 1), self.page):
            yield items[start : start + self.page]


def meta(name: str, uid: str, namespace: str = "shop", labelled: bool = True) -> dict[str, Any]:
    labels = {"app.kubernetes.io/instance": "db"} if labelled else {}
    return {"name": name, "namespace": namespace, "uid": uid, "labels": labels}


POD_PATH = "/api/v1/namespaces/shop/pods"
CLUSTER_PATH = "/apis/db.example.com/v1alpha1/namespaces/shop/postgresclusters"


async def test_sync_lists_in_pages_per_namespace_with_the_watch_selector() -> None:
    reader = Reader(
        {POD_PATH: [meta(f"db-{i}", f"p{i}") for i in range(5)], CLUSTER_PATH: [meta("db", "c1")]}
    )
    gate = SyncGate([PODS.key, CLUSTERS.key])
    task = asyncio.create_task(sync(reader, gate, [PODS, CLUSTERS], ["shop"], poll_seconds=0.01))
    await asyncio.sleep(0.05)
    assert gate.waiting_for() == {PODS.key: 5, CLUSTERS.key: 1}
    assert reader.list_calls == [
        (POD_PATH, {"labelSelector": "app.kubernetes.io/instance"}),
        (CLUSTER_PATH, {}),
    ]
    for i in range(5):
        gate.saw(PODS.key, f"p{i}")
    gate.saw(CLUSTERS.key, "c1")
    await asyncio.wait_for(task, 1)
    assert gate.open and reader.lookups == []


async def test_sync_strikes_off_stragglers_deleted_recreated_or_unlabelled_and_waits_for_the_rest() -> None:
    listed = [meta("db-0", "p0"), meta("db-1", "p1"), meta("db-2", "p2"), meta("db-3", "p3")]
    reader = Reader({POD_PATH: list(listed)})
    gate = SyncGate([PODS.key])
    task = asyncio.create_task(sync(reader, gate, [PODS], ["shop"], stall_seconds=0.05, poll_seconds=0.01))
    await asyncio.sleep(0.03)
    assert gate.waiting_for() == {PODS.key: 4}
    # After the operator's listing: db-0 deleted, db-1 recreated (new uid), db-2 lost its label.
    reader.objects[POD_PATH] = [
        meta("db-1", "p1-new"),
        meta("db-2", "p2", labelled=False),
        meta("db-3", "p3"),
    ]
    await asyncio.sleep(0.2)
    assert not gate.open and gate.waiting_for() == {PODS.key: 1}  # db-3 exists: kopf must still bring it
    assert set(reader.lookups) == {f"db-{i}" for i in range(4)}
    lookups = len(reader.lookups)
    await asyncio.sleep(0.2)
    assert len(reader.lookups) - lookups <= 2  # a lookup that strikes nothing off backs off
    gate.saw(PODS.key, "p3")
    await asyncio.wait_for(task, 1)
    assert gate.open


async def test_sync_retries_a_failed_listing() -> None:
    reader = Reader({CLUSTER_PATH: []})
    reader.fail_lists = 2
    gate = SyncGate([CLUSTERS.key])
    await asyncio.wait_for(
        sync(reader, gate, [CLUSTERS], ["shop"], backoff=Backoff(base=0.01, cap=0.02), poll_seconds=0.01), 2
    )
    assert gate.open and len(reader.list_calls) == 3


@pytest.mark.parametrize("namespaces", [[], ["a", "b"]])
async def test_cluster_scoped_kinds_are_listed_once_and_namespaced_ones_per_namespace(
    namespaces: list[str],
) -> None:
    classes = ListedKind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False)
    reader = Reader({})
    gate = SyncGate([classes.key, PODS.key])
    await asyncio.wait_for(sync(reader, gate, [classes, PODS], namespaces, poll_seconds=0.01), 1)
    paths = [path for path, _ in reader.list_calls]
    pods = [f"/api/v1/namespaces/{ns}/pods" for ns in namespaces] or ["/api/v1/pods"]
    assert paths == ["/apis/storage.k8s.io/v1/storageclasses", *pods]


async def test_a_relist_drops_what_was_deleted_while_the_watch_was_down_and_keeps_what_is_new() -> None:
    reader = Reader({POD_PATH: [meta("db-0", "p0"), meta("db-1", "p1")]})
    pruned: list[tuple[Any, set[str]]] = []
    woken: list[Any] = []

    def prune(kind: Any, keep: set[str]) -> list[Any]:
        pruned.append((kind, set(keep)))
        return [("shop", "db")]

    pruner = RelistPruner(reader, [PODS, CLUSTERS], ["shop"], prune, woken.append)
    pruner.saw(PODS.key, "p9")  # before any relist: not remembered
    pruner.relisted(PODS.key)
    pruner.saw(PODS.key, "p2")  # created after the relist began, not in the operator's listing yet
    task = asyncio.create_task(pruner.run(settle_seconds=0.01))
    await asyncio.sleep(0.1)
    task.cancel()
    # Every kind, not only the one that relisted: the clusters (none left) relist without an event.
    assert pruned == [(PODS.key, {"p0", "p1", "p2"}), (CLUSTERS.key, set())]
    assert woken == [("shop", "db"), ("shop", "db")]
    assert reader.list_calls == [
        (POD_PATH, {"labelSelector": "app.kubernetes.io/instance"}),
        (CLUSTER_PATH, {}),
    ]
    pruner.relisted(("v1", "Event"))  # not a listed kind: ignored
    assert await pruner.prune_once(PODS.key) == [("shop", "db")]  # nothing seen since: the listing only
    assert pruned[-1] == (PODS.key, {"p0", "p1"})
