"""When the cache has seen the whole cluster: nothing reconciles before that.

A pass over a cluster whose StatefulSet or Secret has not reached the cache yet would create it again
(and a Secret again means a new password), so the reconcile and backup workers wait for `SyncGate`.
kopf delivers the first listing of every kind as events but does not say when one is complete (its
own "indexed" signal exists only for kopf indexes, which hold every listed body until all are in). So
the operator lists each kind itself, metadata only and a page at a time, and the gate opens once every
object of those listings has come through kopf's events: the informer "has synced" of client-go.

An object can be deleted between the operator's listing and kopf's; kopf then never delivers it. When
a kind makes no progress for a while, its stragglers are looked up one by one, and those gone (or no
longer selected by the watch's label selector) are struck off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pg_operator.controller.backoff import Backoff

log = logging.getLogger(__name__)

# (namespace or "", name) of a listed object, to look it up if it never arrives.
Ref = tuple[str, str]
# (apiVersion, kind): how the gate names a kind.
KindKey = tuple[str, str]


@dataclass(frozen=True)
class ListedKind:
    """A kind to list for the gate, selected exactly as kopf's watch of it is."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    label_selector: str | None = None  # a label key that must be present, or None for every object

    @property
    def key(self) -> KindKey:
        return (self.api_version, self.kind)

    @property
    def name(self) -> str:
        group = self.api_version.rpartition("/")[0]
        return f"{self.plural}.{group}" if group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.api_version}" if "/" in self.api_version else f"/api/{self.api_version}"
        if namespace and self.namespaced:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base

    def params(self) -> dict[str, str]:
        return {"labelSelector": self.label_selector} if self.label_selector else {}


class SyncGate:
    """Opens when every kind was listed and each listed object was seen (or found gone)."""

    def __init__(self, kinds: Iterable[KindKey], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._unlisted = set(kinds)
        self._seen: dict[KindKey, set[str]] = {k: set() for k in self._unlisted}
        self._pending: dict[KindKey, dict[str, Ref]] = {}
        self._progress: dict[KindKey, float] = {}
        self._opened = asyncio.Event()
        self.open = False
        self._check()

    def saw(self, kind: KindKey, uid: str) -> None:
        """An object came through the watch (any event, DELETED included)."""
        if self.open or kind not in self._seen:
            return
        pending = self._pending.get(kind)
        if pending is None:
            self._seen[kind].add(uid)  # not listed yet: remembered, so the listing does not wait for it
        elif pending.pop(uid, None) is not None:
            self._progress[kind] = self._clock()
            if not pending:
                self._check()

    def listed(self, kind: KindKey, objects: Mapping[str, Ref]) -> None:
        """The operator's own listing of `kind` (uid → where), complete."""
        if self.open or kind not in self._unlisted:
            return
        seen = self._seen[kind]
        self._pending[kind] = {uid: ref for uid, ref in objects.items() if uid not in seen}
        self._seen[kind] = set()
        self._unlisted.discard(kind)
        self._progress[kind] = self._clock()
        self._check()

    def gone(self, kind: KindKey, uid: str) -> None:
        """A listed object that no longer exists as the watch would see it."""
        if not self.open and self._pending.get(kind, {}).pop(uid, None) is not None:
            self._progress[kind] = self._clock()
            self._check()

    def stalled(self, after: float) -> dict[KindKey, dict[str, Ref]]:
        """Per kind, the objects still awaited when that kind has made no progress for `after` seconds."""
        now = self._clock()
        return {
            kind: dict(pending)
            for kind, pending in self._pending.items()
            if pending and now - self._progress.get(kind, now) >= after
        }

    def waiting_for(self) -> dict[KindKey, int]:
        """Objects still awaited by kind (-1: the kind is not listed yet)."""
        out = {kind: -1 for kind in self._unlisted}
        out.update({kind: len(p) for kind, p in self._pending.items() if p})
        return out

    def _check(self) -> None:
        if self._unlisted or any(self._pending.values()):
            return
        self.open = True
        self._seen.clear()
        self._pending.clear()
        self._opened.set()

    async def wait(self) -> None:
        await self._opened.wait()


class MetadataReader(Protocol):
    """What the gate needs from the API server (`kube.Api` is one)."""

    def list_metadata(self, path: str, params: Mapping[str, str]) -> AsyncIterator[list[dict[str, Any]]]:
        """The objects' metadata, a page at a time."""
        ...


# Lookups of one kind's stragglers per round; a kind whose lookups found nothing gone waits longer.
MAX_LOOKUPS = 100
MAX_LOOKUP_INTERVAL = 300.0


async def _list_kind(reader: MetadataReader, kind: ListedKind, namespaces: list[str]) -> dict[str, Ref]:
    objects: dict[str, Ref] = {}
    for namespace in namespaces if kind.namespaced and namespaces else [None]:
        async for page in reader.list_metadata(kind.path(namespace), kind.params()):
            for meta in page:
                objects[str(meta.get("uid"))] = (str(meta.get("namespace") or ""), str(meta.get("name")))
    return objects


async def _still_there(reader: MetadataReader, kind: ListedKind, uid: str, ref: Ref) -> bool:
    """Does the watch still select this object? A list by name with the watch's own selector (a list,
    not a get: the verbs the operator already holds for every kind)."""
    namespace, name = ref
    params = {**kind.params(), "fieldSelector": f"metadata.name={name}"}
    async for page in reader.list_metadata(kind.path(namespace or None), params):
        if any(str(meta.get("uid")) == uid for meta in page):
            return True
    return False


async def _strike_off_gone(
    reader: MetadataReader, gate: SyncGate, kind: ListedKind, pending: Mapping[str, Ref]
) -> int:
    struck = 0
    for uid, ref in list(pending.items())[:MAX_LOOKUPS]:
        if not await _still_there(reader, kind, uid, ref):
            gate.gone(kind.key, uid)
            struck += 1
    return struck


async def sync(
    reader: MetadataReader,
    gate: SyncGate,
    kinds: list[ListedKind],
    namespaces: list[str],
    *,
    stall_seconds: float = 10.0,
    poll_seconds: float = 1.0,
    backoff: Backoff | None = None,
) -> None:
    """List every kind for the gate, then strike off stragglers until it opens. Failures retry."""
    backoff = backoff or Backoff()
    by_key = {k.key: k for k in kinds}
    started = time.monotonic()
    for kind in kinds:
        failures = 0
        while True:
            try:
                gate.listed(kind.key, await _list_kind(reader, kind, namespaces))
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                delay = backoff.delay(failures)
                log.warning("cache sync: listing %s failed, retrying in %.1fs: %s", kind.name, delay, exc)
                await asyncio.sleep(delay)
    due: dict[KindKey, float] = {}
    interval: dict[KindKey, float] = {}
    while not gate.open:
        await asyncio.sleep(poll_seconds)
        for key, pending in gate.stalled(stall_seconds).items():
            now = time.monotonic()
            if now < due.get(key, 0.0):
                continue
            kind = by_key[key]
            log.info("cache sync: %d %s listed but not seen yet; looking them up", len(pending), kind.name)
            try:
                struck = await _strike_off_gone(reader, gate, kind, pending)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cache sync: looking up %s failed: %s", kind.name, exc)
                struck = 0
            wait = stall_seconds if struck else min(interval.get(key, stall_seconds) * 2, MAX_LOOKUP_INTERVAL)
            interval[key] = wait
            due[key] = now + wait
    log.info("cache synced in %.1fs", time.monotonic() - started)


class RelistPruner:
    """Drops what a relist shows to be gone: kopf relists a kind after its watch broke (an API server
    restart, a 410 after compaction) and sends the objects it finds, but nothing for those deleted while
    it was not watching. An informer replaces its store; here, once a kind is relisted, the operator
    lists every kind itself and drops each cached object neither in that listing nor seen since the
    relist began (what is created meanwhile must stay)."""

    def __init__(
        self,
        reader: MetadataReader,
        kinds: list[ListedKind],
        namespaces: list[str],
        prune: Callable[[KindKey, set[str]], list[Any]],
        wake: Callable[[Any], None],
    ) -> None:
        self._reader = reader
        self._kinds = {k.key: k for k in kinds}
        self._namespaces = namespaces
        self._prune = prune
        self._wake = wake
        self._seen: dict[KindKey, set[str]] = {}  # per relisted kind, every uid since the relist began
        self._due = asyncio.Event()

    def relisted(self, kind: KindKey) -> None:
        """kopf relists `kind`. Every kind is pruned then, not only those that say so: a kind with
        nothing left (its last object deleted while no one watched) relists without a single event,
        and what breaks one watch (an API server restart) breaks them all."""
        if kind not in self._kinds or kind in self._seen:
            return
        for each in self._kinds:
            self._seen.setdefault(each, set())
        self._due.set()

    def saw(self, kind: KindKey, uid: str) -> None:
        seen = self._seen.get(kind)
        if seen is not None:
            seen.add(uid)

    async def prune_once(self, kind: KindKey) -> list[Any]:
        """List `kind` and drop what neither the listing nor the watch has shown since; the clusters
        whose objects were dropped are woken."""
        listed = await _list_kind(self._reader, self._kinds[kind], self._namespaces)
        keep = set(listed) | self._seen.pop(kind, set())
        woken = self._prune(kind, keep)
        if woken:
            log.info("cache: %s of %d cluster(s) gone while the watch was down; waking them",
                     self._kinds[kind].name, len(woken))  # fmt: skip
        for key in woken:
            self._wake(key)
        return woken

    async def run(self, settle_seconds: float = 2.0, backoff: Backoff | None = None) -> None:
        backoff = backoff or Backoff()
        failures = 0
        while True:
            await self._due.wait()
            await asyncio.sleep(settle_seconds)  # one listing for a burst of relisted kinds
            self._due.clear()
            for kind in list(self._seen):
                try:
                    await self.prune_once(kind)
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    log.warning("cache: pruning %s after a relist failed: %s", self._kinds[kind].name, exc)
                    self._due.set()  # its uids seen so far stay; the next try keeps them too
                    await asyncio.sleep(backoff.delay(failures))
