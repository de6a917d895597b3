"""The informer's list-then-watch: pages delivered in order with their kind, the listing's uids handed on,
the watch resumed from the last version seen (bookmarks included), a new listing after 410 Gone; and the
line splitting and event decoding of a watch stream. The API server here is a script of plain dicts."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from pg_operator.controller.backoff import Backoff
from pg_operator.controller.cache_sync import ListedKind
from pg_operator.controller.informer import (
    NOT_SERVED_SECONDS,
    Feed,
    Gone,
    Informer,
    Informers,
    event_of,
    lines,
    retry_delay,
)
from pg_operator.controller.kube_api import HttpStatusError

PODS = ListedKind("v1", "Pod", "pods", label_selector="app.kubernetes.io/instance")


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "resourceVersion": rv}}


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def collect(source: AsyncIterator[bytes]) -> list[bytes]:
    return [line async for line in source]


async def test_lines_are_split_across_and_within_chunks() -> None:
    got = await collect(lines(chunks(b'{"a":', b'1}\n{"b"', b":2}\n\n{", b'"c":3}\n', b'{"d":4}')))
    assert got == [b'{"a":1}', b'{"b":2}', b'{"c":3}', b'{"d":4}']


def test_events_decode_and_errors_raise() -> None:
    assert event_of(event("ADDED", pod("db-0", "5"))) == ("ADDED", pod("db-0", "5"))
    with pytest.raises(Gone):
        event_of(event("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"}))
    with pytest.raises(RuntimeError, match="watch error 500"):
        event_of(event("ERROR", {"kind": "Status", "code": 500, "message": "boom"}))


class Response:
    def __init__(self, body: list[bytes]) -> None:
        self.body = body

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for part in self.body:
            yield part


class Script:
    """Listings (pages by continue token) and watch streams, handed out in order; a watch with nothing
    left to send waits until cancelled."""

    def __init__(self, listings: list[list[dict[str, Any]]], watches: list[list[bytes] | Exception]) -> None:
        self.listings = listings
        self.watches = watches
        self.list_calls: list[dict[str, str]] = []
        self.watch_calls: list[dict[str, str]] = []

    async def list_page(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        assert path == "/api/v1/namespaces/shop/pods"
        self.list_calls.append(dict(params))
        at = int(params.get("continue", "0"))
        if at == 0:
            self.current = self.listings.pop(0)
        page = self.current[at]
        more = {"continue": str(at + 1)} if at + 1 < len(self.current) else {}
        meta = {"resourceVersion": page["rv"], **more}
        return {"metadata": meta, "items": [dict(i) for i in page["items"]]}

    @contextlib.asynccontextmanager
    async def watch(self, path: str, params: Mapping[str, str]) -> AsyncIterator[Response]:
        self.watch_calls.append(dict(params))
        if not self.watches:
            await asyncio.Event().wait()
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield Response(step)


async def test_lists_in_pages_then_watches_resuming_from_the_last_version_and_relists_after_gone() -> None:
    delivered: list[tuple[str, str | None]] = []
    listed: list[tuple[set[str], bool]] = []
    script = Script(
        listings=[
            [{"rv": "10", "items": [pod("db-0", "3")]}, {"rv": "10", "items": [pod("db-1", "4")]}],
            [{"rv": "30", "items": [pod("db-0", "3")]}],
        ],
        watches=[
            [event("ADDED", pod("db-2", "11")), event("BOOKMARK", {"metadata": {"resourceVersion": "15"}})],
            [event("DELETED", pod("db-1", "16"))],
            [event("ERROR", {"kind": "Status", "code": 410, "message": "too old"})],
        ],
    )

    def deliver(body: dict[str, Any], event_type: str | None) -> None:
        assert body.get("metadata", {}).get("name")
        if event_type is None:
            assert (body["apiVersion"], body["kind"]) == ("v1", "Pod")  # a listing's items get their kind
        delivered.append((body["metadata"]["name"], event_type))

    feed = Feed(PODS, deliver)
    informer = Informer(script, feed, "shop", lambda f, ns, uids, first: listed.append((uids, first)),
                        backoff=Backoff(base=0.001))  # fmt: skip
    task = asyncio.create_task(informer.run())
    for _ in range(200):
        await asyncio.sleep(0)
        if len(listed) == 2 and len(script.watch_calls) == 4:
            break
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert delivered == [("db-0", None), ("db-1", None), ("db-2", "ADDED"), ("db-1", "DELETED"),
                         ("db-0", None)]  # fmt: skip
    assert listed == [({"uid-db-0", "uid-db-1"}, True), ({"uid-db-0"}, False)]
    selector = {"labelSelector": "app.kubernetes.io/instance"}
    assert script.list_calls == [{**selector, "limit": "100"}, {**selector, "limit": "100", "continue": "1"},
                                 {**selector, "limit": "100"}]  # fmt: skip
    # Resumed from the bookmark, then from the deletion, then from the new listing.
    assert [w["resourceVersion"] for w in script.watch_calls] == ["10", "15", "16", "30"]
    assert all(w["labelSelector"] == "app.kubernetes.io/instance" for w in script.watch_calls)


async def test_a_failed_watch_backs_off_and_lists_again() -> None:
    listed: list[bool] = []
    script = Script(listings=[[{"rv": "1", "items": []}], [{"rv": "2", "items": []}]],
                    watches=[ConnectionError("reset")])  # fmt: skip
    informer = Informer(script, Feed(PODS, lambda b, t: None), "shop",
                        lambda f, ns, u, first: listed.append(first), backoff=Backoff(base=1e-3))  # fmt: skip
    task = asyncio.create_task(informer.run())
    for _ in range(200):
        await asyncio.sleep(0.001)
        if len(listed) == 2:
            break
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert listed == [True, False]


def test_one_informer_per_namespace_for_namespaced_kinds_and_the_gate_awaits_only_awaited_feeds() -> None:
    classes = ListedKind("storage.k8s.io/v1", "StorageClass", "storageclasses", namespaced=False)
    backups = ListedKind("db.example.com/v1alpha1", "Backup", "backups")
    feeds = [Feed(PODS, lambda b, t: None), Feed(classes, lambda b, t: None),
             Feed(backups, lambda b, t: None, awaited=False)]  # fmt: skip
    informers = Informers(Script([], []), feeds, ["a", "b"], lambda f, ns, u, first: None)
    assert [(i.feed.kind.kind, i.namespace) for i in informers.informers] == [
        ("Pod", "a"),
        ("Pod", "b"),
        ("StorageClass", None),
        ("Backup", "a"),
        ("Backup", "b"),
    ]
    assert informers.awaited() == [(PODS.key, "a"), (PODS.key, "b"), (classes.key, None)]


async def test_an_object_its_taker_fails_on_is_logged_and_the_rest_still_delivered() -> None:
    taken: list[str] = []

    def deliver(body: dict[str, Any], event_type: str | None) -> None:
        if body["metadata"]["name"] == "bad":
            raise KeyError("spec")
        taken.append(body["metadata"]["name"])

    script = Script(listings=[[{"rv": "1", "items": [pod("bad", "1"), pod("db-0", "1")]}]], watches=[])
    informer = Informer(script, Feed(PODS, deliver), "shop", lambda f, ns, u, first: None)
    assert await informer.list_once() == "1"
    assert taken == ["db-0"] and informer.lists == 1


def test_a_kind_not_served_is_asked_for_again_after_minutes_other_failures_back_off() -> None:
    backoff = Backoff(base=1.0, cap=30.0, jitter=0.0)
    missing = HttpStatusError(404, "GET /apis/db.example.com/v1alpha1/backups: HTTP 404")
    assert retry_delay(missing, 1, backoff) == retry_delay(missing, 9, backoff) == NOT_SERVED_SECONDS >= 300
    assert [retry_delay(ConnectionError("reset"), n, backoff) for n in (1, 2, 3, 9)] == [1.0, 2.0, 4.0, 30.0]
    assert retry_delay(HttpStatusError(403, "forbidden"), 1, backoff) == 1.0
