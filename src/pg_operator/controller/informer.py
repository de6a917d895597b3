"""The cache's feed: for each watched kind, in each namespace it is watched in, a listing and then a watch.

An `Informer` lists its kind a page at a time and hands every object to its feed's `deliver` (event type
None, as for an object of a listing), then tells `listed` which uids the listing held: the first time
the sync gate counts it; after a watch was lost, the cache drops what it holds beyond them (objects
deleted while no one watched). It then watches from the listing's resourceVersion with bookmarks, every
event to `deliver` in the order the API server sent it, and resumes a watch that ended from the last
version seen. A watch refused as too old (410 Gone: etcd compacted past it) is followed by a new listing;
any other failure backs off and lists again.

Why not kopf: the operator used none of what kopf adds to a watch (handlers with state, diffs, indexes,
posting), had to turn each off, and paid for its per-object workers on every event (about a fifth of the
operator's CPU at 500 new clusters) and a second listing of its own to know when the first was complete.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pg_operator.controller.backoff import Backoff
from pg_operator.controller.cache_sync import FeedKey, KindKey, ListedKind

log = logging.getLogger(__name__)

# Objects per page of a listing: a restart over 1000 clusters holds one page of whole objects at a time.
PAGE_SIZE = 100
# How often a kind the API server does not serve (404: a backup CRD not installed) is asked for again.
NOT_SERVED_SECONDS = 300.0


@dataclass(frozen=True)
class Feed:
    """A kind to list and watch, and who takes its objects. `deliver(body, event_type)` gets each one:
    event_type None for an object of a listing, else "ADDED", "MODIFIED" or "DELETED". `awaited`: the
    sync gate waits for its first listing (not for kinds whose CRD may be missing, the backups')."""

    kind: ListedKind
    deliver: Callable[[dict[str, Any], str | None], None]
    awaited: bool = True
    # A kind whose first listing must be complete before this one is listed: the cache judges a labelled
    # Secret by what its cluster reads, so Secrets are listed once the clusters are in.
    after: KindKey | None = None


class Listed(Protocol):
    def __call__(self, feed: Feed, namespace: str | None, uids: set[str], first: bool) -> None:
        """A complete listing of `feed`'s kind in `namespace` (None: everywhere) has been delivered."""


class Stream(Protocol):
    """What an informer needs of the API server (`kube_api.Api` is one)."""

    async def list_page(self, path: str, params: Mapping[str, str]) -> dict[str, Any]: ...

    def watch(self, path: str, params: Mapping[str, str]) -> Any:
        """An async context manager whose value has `aiter_bytes()`."""
        ...


class Gone(Exception):
    """The resourceVersion to resume from is too old: list again."""


def status_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


async def lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The newline-separated lines of a byte stream (a watch sends one JSON event per line)."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end > start:
                yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
    if buffer.strip():
        yield bytes(buffer)


def event_of(line: bytes) -> tuple[str, dict[str, Any]]:
    """A watch event's type and object; ERROR events raise Gone (410) or RuntimeError."""
    event = json.loads(line)
    kind, obj = str(event.get("type") or ""), event.get("object")
    if not isinstance(obj, dict):
        raise RuntimeError(f"a watch event of type {kind!r} without an object")
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise Gone(str(obj.get("message") or "resource version too old"))
        raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
    return kind, obj


def retry_delay(exc: BaseException, failures: int, backoff: Backoff) -> float:
    """Seconds before listing again after `failures` failures in a row, the last `exc`: a kind that is not
    served is not asked for every few seconds for the life of the process."""
    return NOT_SERVED_SECONDS if status_code(exc) == 404 else backoff.delay(failures)


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """One kind in one namespace (or everywhere): list, then watch, for as long as it runs."""

    def __init__(self, api: Stream, feed: Feed, namespace: str | None, listed: Listed,
                 backoff: Backoff | None = None) -> None:  # fmt: skip
        self.api = api
        self.feed = feed
        self.namespace = namespace
        self._listed = listed
        self._backoff = backoff or Backoff(cap=30.0)
        self.lists = 0  # complete listings so far
        # Set by `Informers` when this feed waits for another kind's first listing.
        self.preceded_by: asyncio.Event | None = None

    @property
    def key(self) -> FeedKey:
        return (self.feed.kind.key, self.namespace)

    def _deliver(self, body: dict[str, Any], event_type: str | None) -> None:
        # One object its taker cannot handle must not stop the kind's watch (and relist it forever).
        try:
            self.feed.deliver(body, event_type)
        except Exception:
            meta = body.get("metadata") or {}
            log.exception("%s event of %s %s/%s not taken", event_type or "listing", self.feed.kind.kind,
                          meta.get("namespace") or "", meta.get("name"))  # fmt: skip

    def where(self) -> str:
        return f"{self.feed.kind.name}" + (f" in {self.namespace}" if self.namespace else "")

    async def run(self) -> None:
        if self.preceded_by is not None:
            await self.preceded_by.wait()
        failures = 0
        while True:
            try:
                version = await self.list_once()
                failures = 0
                await self.watch_from(version)
                log.info("watch of %s is too old; listing again", self.where())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                code = status_code(exc)
                delay = retry_delay(exc, failures, self._backoff)
                # A backup CRD that is not installed answers 404 until it is: said once, then quietly.
                level = logging.DEBUG if code == 404 and failures > 1 else logging.WARNING
                log.log(level, "watching %s failed, listing again in %.1fs: %s: %s",
                        self.where(), delay, type(exc).__name__, exc)  # fmt: skip
                await asyncio.sleep(delay)

    async def list_once(self) -> str:
        """Deliver every object of one listing; its resourceVersion, to watch from."""
        kind = self.feed.kind
        path = kind.path(self.namespace)
        query = {**kind.params(), "limit": str(kind.page_size or PAGE_SIZE)}
        uids: set[str] = set()
        version = ""
        while True:
            page = await self.api.list_page(path, query)
            for item in page.get("items") or ():
                # A listing's items carry no kind of their own; the cache files them by it.
                item["apiVersion"], item["kind"] = kind.api_version, kind.kind
                uids.add(str((item.get("metadata") or {}).get("uid") or ""))
                self._deliver(item, None)
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue")
            if not token:
                break
            query["continue"] = str(token)
        uids.discard("")
        self.lists += 1
        self._listed(self.feed, self.namespace, uids, self.lists == 1)
        return version

    async def watch_from(self, version: str) -> None:
        """Deliver watch events from `version` on, resuming each watch the server ends; returns when the
        version is too old to resume from."""
        kind = self.feed.kind
        path = kind.path(self.namespace)
        while True:
            try:
                async with self.api.watch(path, {**kind.params(), "resourceVersion": version}) as resp:
                    async for line in lines(resp.aiter_bytes()):
                        event_type, obj = event_of(line)
                        version = resource_version(obj) or version
                        if event_type != "BOOKMARK":
                            self._deliver(obj, event_type)
            except Gone:
                return
            except Exception as exc:
                if status_code(exc) == 410:
                    return
                raise


class Informers:
    """Every feed's informers, one per namespace it is watched in; `listed` is told of every listing."""

    def __init__(self, api: Stream, feeds: list[Feed], namespaces: list[str], listed: Listed) -> None:
        self._listed = listed
        self.informers = [Informer(api, feed, namespace, self._on_listed)
                          for feed in feeds for namespace in feed.kind.namespaces(namespaces)]  # fmt: skip
        # Per kind, its informers still to complete a first listing, and the event that says they have.
        self._unlisted: dict[KindKey, int] = {}
        for informer in self.informers:
            self._unlisted[informer.feed.kind.key] = self._unlisted.get(informer.feed.kind.key, 0) + 1
        self._first_listed = {kind: asyncio.Event() for kind in self._unlisted}
        for informer in self.informers:
            after = informer.feed.after
            if after is not None and after in self._first_listed:
                informer.preceded_by = self._first_listed[after]

    def _on_listed(self, feed: Feed, namespace: str | None, uids: set[str], first: bool) -> None:
        self._listed(feed, namespace, uids, first)
        kind = feed.kind.key
        if first and kind in self._unlisted:
            self._unlisted[kind] -= 1
            if self._unlisted[kind] == 0:
                self._first_listed[kind].set()

    def awaited(self) -> list[FeedKey]:
        """What the sync gate waits for."""
        return [i.key for i in self.informers if i.feed.awaited]

    async def run(self) -> None:
        tasks = [asyncio.create_task(i.run(), name=f"watch {i.where()}") for i in self.informers]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
