"""How a reconcile writes: server-side apply only where an object differs, a memo so a quick second reconcile
does not repeat a write the watch cache has not shown yet, and independent writes sent together.

A cluster writes only what it owns (specs/ownership.py): every write of a cluster's object goes through
here with the reconcile's `Claims`. An object the cache does not show is created by a create-only write (a
child by an apply that an existing object refuses, a Secret by POST), which fails when any object holds
the name (then its metadata is read: ours, because the cache lags, or foreign, a conflict); an object the
cache shows as the cluster's is applied, patched or deleted with its uid as a precondition, so one that
replaced it meanwhile is refused by the API server instead of taken over. No write path applies with
force to an object it has not seen to be the cluster's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.controller.diff import HASH_ANNOTATION, object_differences, with_hash
from pg_operator.controller.kube_api import Api, is_conflict, is_not_found
from pg_operator.specs.ownership import ObjectId, controlled_by, holder

log = logging.getLogger(__name__)

# (namespace, kind, name, what): one kind of write to one object.
WriteId = tuple[str, str, str, str]


async def all_of(writes: Iterable[Awaitable[int]]) -> int:
    """Run the writes together and wait for every one; then raise the first failure (so a refusal keeps
    its type for the callers' checks, and no write is left running behind a reconcile that ended) or return
    how many were made."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return sum(r for r in results if isinstance(r, int))


def canonical(value: Any) -> str:
    """A value's one text form (keys sorted): equal values, equal texts."""
    return json.dumps(value, sort_keys=True, default=str)


def status_patch(previous: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch turning `previous` status into exactly `desired` (removed keys set to null)."""
    patch: dict[str, Any] = dict(desired)
    for k in previous or {}:
        if k not in desired:
            patch[k] = None
    return {"status": patch}


class WriteMemo:
    """Writes the cache has not shown us yet, so a quick second reconcile does not repeat them.

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


def ident_of(body: Mapping[str, Any]) -> ObjectId:
    return (str(body.get("apiVersion")), str(body.get("kind")), objects.name(body))


@dataclass
class Claims:
    """What one reconcile may write for its cluster, and the foreign objects it met at the cluster's names."""

    namespace: str
    owner_uid: str
    # Foreign objects the cache showed at the cluster's names (set aside from the reconcile's snapshot).
    foreign: dict[ObjectId, Mapping[str, Any]] = field(default_factory=dict)
    # Those the reconcile would have written (or a POST found in its way): who holds each, in words.
    conflicts: dict[ObjectId, str] = field(default_factory=dict)
    # Objects not written because they would put a foreign one to use (specs.ownership.needs).
    held: dict[ObjectId, set[ObjectId]] = field(default_factory=dict)
    # Foreign objects a write found in its way (the cache does not hold them: no cluster label), which
    # the next passes may take as known for a while instead of asking again (Reconciler).
    met: dict[ObjectId, Mapping[str, Any]] = field(default_factory=dict)

    def blocked(self, ident: ObjectId) -> bool:
        """Whether a foreign object is known to hold `ident`; if so the write is a conflict."""
        if ident in self.conflicts:
            return True
        body = self.foreign.get(ident)
        if body is None:
            return False
        self.conflicts[ident] = holder(body)
        return True

    def found(self, ident: ObjectId, body: Mapping[str, Any]) -> None:
        """A write found a foreign object in its way."""
        self.foreign[ident] = body
        self.conflicts[ident] = holder(body)
        self.met[ident] = body

    def foreign_among(self, idents: Iterable[ObjectId]) -> set[ObjectId]:
        return {i for i in idents if i in self.conflicts or i in self.foreign}

    def ours(self, body: Mapping[str, Any] | None) -> bool:
        return controlled_by(body, self.owner_uid)


class Made(Enum):
    CREATED = "created"
    OURS = "ours"  # the name was taken by the cluster's own object (the cache had not shown it)
    FOREIGN = "foreign"  # taken by an object that is not the cluster's: recorded in the claims
    GONE = "gone"  # taken, and gone again before it could be read


def uid_refused(exc: ApiError) -> bool:
    """Whether the API server refused a write because the object under the name is not the one whose
    uid the write carried (a precondition or the immutable uid), or there is none."""
    status = exc.status
    if status is None or status.code not in (409, 422):
        return False
    causes = (status.details.causes if status.details is not None else None) or ()
    if any(str(c.field or "") == "metadata.uid" for c in causes):
        return True
    # 422 "metadata.uid: ... field is immutable" (apply, merge patch), 409 "uid mismatch ... no existing
    # object was found" (apply), 409 "the UID in the precondition ... does not match" (delete)
    message = str(status.message or "").lower()
    return any(s in message for s in ("metadata.uid", "uid mismatch", "uid in the precondition",
                                       "uid in precondition"))  # fmt: skip


async def _holder(api: Api, claims: Claims, ident: ObjectId) -> tuple[Made, Any]:
    """After a create-only write was refused: whose is the object under the name?"""
    meta = await api.find_metadata(ident[0], ident[1], ident[2], claims.namespace)
    if meta is None:
        return Made.GONE, None
    if claims.ours({"metadata": meta}):
        return Made.OURS, meta
    log.warning("%s %s/%s exists and is not this cluster's (%s): left alone", ident[1], claims.namespace,
                ident[2], holder({"metadata": meta}))  # fmt: skip
    claims.found(ident, {"metadata": meta})
    return Made.FOREIGN, meta


async def create(api: Api, claims: Claims, body: Mapping[str, Any]) -> tuple[Made, Any]:
    """Create-only (POST), never over another object: (what happened, the object created or the
    metadata of the one found). For objects written once (Secrets); children are applied."""
    ident = ident_of(body)
    if claims.blocked(ident):
        return Made.FOREIGN, None
    try:
        return Made.CREATED, await api.create_dict(body)
    except ApiError as exc:
        if not is_conflict(exc):
            raise
    return await _holder(api, claims, ident)


async def patch(api: Api, claims: Claims, res: type[Any], observed: Mapping[str, Any] | None,
                merge_patch: Mapping[str, Any]) -> bool:  # fmt: skip
    """A merge patch of an object the reconcile observed as the cluster's, pinned to its uid. False when it
    was not the cluster's (a conflict) or is no longer there as observed (its watch event brings the next
    pass); the API server's other refusals (say, a stale resourceVersion precondition: 409) raise."""
    if observed is None:
        return False
    ident = (str(observed.get("apiVersion") or ""), str(observed.get("kind") or ""), objects.name(observed))
    if not claims.ours(observed):
        claims.found(ident, observed)
        return False
    body = dict(merge_patch)
    body["metadata"] = {**(body.get("metadata") or {}), "uid": objects.uid(observed)}
    try:
        await api.merge_patch(res, objects.name(observed), claims.namespace, body)
    except ApiError as exc:
        if is_not_found(exc) or uid_refused(exc):
            return False
        raise
    return True


async def delete(api: Api, claims: Claims, observed: Mapping[str, Any]) -> bool:
    """Delete an object the reconcile observed as the cluster's, pinned to its uid; False when it was not the
    cluster's or is gone or replaced."""
    if not claims.ours(observed):
        return False
    try:
        await api.delete(str(observed.get("apiVersion")), str(observed.get("kind")), objects.name(observed),
                         claims.namespace, uid=objects.uid(observed))  # fmt: skip
    except ApiError as exc:
        if is_not_found(exc) or uid_refused(exc) or is_conflict(exc):
            return False
        raise
    return True


class Applier:
    """Server-side apply of a desired object, only where the observed one differs, and only to the
    cluster's own object: created with POST where the cache shows none, applied with its uid pinned
    where the cache shows the cluster's."""

    def __init__(self, api: Api, memo: WriteMemo) -> None:
        self.api = api
        self.memo = memo

    async def apply_if_needed(
        self, claims: Claims, desired: dict[str, Any], observed: dict[str, Any] | None
    ) -> bool:
        body = with_hash(desired)
        meta = body["metadata"]
        namespace = claims.namespace
        if claims.blocked(ident_of(body)):
            return False
        if observed is not None and not claims.ours(observed):
            claims.found(ident_of(body), observed)
            return False
        diffs = object_differences(body, observed)
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
        if observed is None:
            if not await self._create(claims, body):
                return False
        elif not await self._apply(body, objects.uid(observed)):
            return False
        self.memo.wrote(ident, rv, fingerprint)
        return True

    async def _create(self, claims: Claims, body: dict[str, Any]) -> bool:
        """The cache shows none: a create-only apply (Api.apply), then, if something holds the name,
        an apply pinned to it only if it is the cluster's (the cache had not shown it yet)."""
        try:
            await self.api.apply(body, create_only=True)
            return True
        except ApiError as exc:
            if not is_conflict(exc):
                raise
        made, found = await _holder(self.api, claims, ident_of(body))
        if made is Made.OURS:
            return await self._apply(body, str(found.get("uid") or ""))
        return False

    async def _apply(self, body: dict[str, Any], uid: str) -> bool:
        try:
            await self.api.apply(body, uid=uid)
        except ApiError as exc:
            if uid_refused(exc):
                log.info("%s %s: replaced or deleted since the cache showed it; not applied", body["kind"],
                         body["metadata"]["name"])  # fmt: skip
                return False
            raise
        return True
