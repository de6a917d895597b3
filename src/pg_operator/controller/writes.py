"""How a pass writes: server-side apply only where an object differs, a memo so a quick second pass
does not repeat a write the watch cache has not shown yet, and independent writes sent together."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from pg_operator import objects
from pg_operator.controller.diff import HASH_ANNOTATION, object_differences, with_hash
from pg_operator.controller.kube_api import Api

log = logging.getLogger(__name__)

# (namespace, kind, name, what): one kind of write to one object.
WriteId = tuple[str, str, str, str]


async def all_of(writes: Iterable[Awaitable[int]]) -> int:
    """Run the writes together and wait for every one; then raise the first failure (so a refusal keeps
    its type for the callers' checks, and no write is left running behind a pass that ended) or return
    how many were made."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return sum(r for r in results if isinstance(r, int))


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class WriteMemo:
    """Writes the cache has not shown us yet, so a quick second pass does not repeat them.

    Keyed by object; holds the resourceVersion we observed when we wrote and a fingerprint of what we
    wrote. While the cache still shows that same resourceVersion, the same write is not repeated.
    Entries expire, so a lost watch event cannot suppress a needed write for long.
    """

    def __init__(self, ttl: float = 30.0) -> None:
        self.ttl = ttl
        self._entries: dict[WriteId, tuple[str | None, str, float]] = {}

    def pending(self, ident: WriteId, observed_rv: str | None, fingerprint: str) -> bool:
        entry = self._entries.get(ident)
        if entry is None:
            return False
        rv, fp, at = entry
        if rv != observed_rv or time.monotonic() - at > self.ttl:
            del self._entries[ident]
            return False
        return fp == fingerprint

    def seen(self, ident: WriteId) -> None:
        """The cache shows the object as we want it: the write (if any) arrived. Were the entry kept,
        the object deleted soon after would look like our create not yet seen, and stay missing."""
        self._entries.pop(ident, None)

    def wrote(self, ident: WriteId, observed_rv: str | None, fingerprint: str) -> None:
        now = time.monotonic()
        if len(self._entries) > 4096:  # entries of deleted clusters are never looked up again
            self._entries = {k: v for k, v in self._entries.items() if now - v[2] <= self.ttl}
        self._entries[ident] = (observed_rv, fingerprint, now)


class Applier:
    """Server-side apply of a desired object, only where the observed one differs."""

    def __init__(self, api: Api, memo: WriteMemo) -> None:
        self.api = api
        self.memo = memo

    async def apply_if_needed(
        self, namespace: str, desired: dict[str, Any], observed: dict[str, Any] | None
    ) -> bool:
        body = with_hash(desired)
        diffs = object_differences(body, observed)
        meta = body["metadata"]
        ident = (namespace, body["kind"], meta["name"], "apply")
        if not diffs:
            self.memo.seen(ident)
            return False
        rv = objects.resource_version(observed)
        fingerprint = meta["annotations"][HASH_ANNOTATION]
        if self.memo.pending(ident, rv, fingerprint):
            return False
        log.info(
            "applying %s %s/%s (differs at %s)", body["kind"], namespace, meta["name"], ", ".join(diffs[:4])
        )
        await self.api.apply(body)
        self.memo.wrote(ident, rv, fingerprint)
        return True
