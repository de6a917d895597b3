"""When the cache has seen the whole cluster: nothing reconciles before that.

A pass over a cluster whose StatefulSet or Secret has not reached the cache yet would create it again
(and a Secret again means a new password), so the reconcile and backup workers wait for `SyncGate`. The
informers (controller/informer.py) list every watched kind before they watch it and say when a listing
is complete, every object of it already in the cache: the gate opens once each kind has been listed in
each namespace it is watched in (the informer "has synced" of client-go).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

# (apiVersion, kind): how the gate names a kind.
KindKey = tuple[str, str]
# A kind as one informer watches it: in one namespace, or everywhere (None).
FeedKey = tuple[KindKey, str | None]


@dataclass(frozen=True)
class ListedKind:
    """A kind as the operator lists and watches it: where, and with which label selector."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    label_selector: str | None = None  # a label key that must be present, or None for every object
    # Objects per page of a listing (None: the informer's default). Secrets come in smaller pages: a
    # tenant's labelled Secrets may be large, and a page is held whole while it is read.
    page_size: int | None = None

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

    def namespaces(self, watched: list[str]) -> list[str | None]:
        """Where it is watched: each of the operator's namespaces, or everywhere (cluster-wide install,
        or a kind that lives in no namespace)."""
        return list(watched) if self.namespaced and watched else [None]


class SyncGate:
    """Opens once every awaited feed (a kind in a namespace) has had a complete listing. Made without
    `feeds`, it stays closed until `expect` names them (the process knows its health gate before it
    knows what it will watch)."""

    def __init__(self, feeds: Iterable[FeedKey] | None = None) -> None:
        self._expecting = feeds is not None
        self._unlisted = set(feeds or ())
        self._listed: set[FeedKey] = set()
        self._opened = asyncio.Event()
        self.open = False
        self._check()

    def expect(self, feeds: Iterable[FeedKey]) -> None:
        if self.open:
            return
        self._expecting = True
        self._unlisted |= set(feeds) - self._listed
        self._check()

    def listed(self, kind: KindKey, namespace: str | None = None) -> None:
        """The listing of `kind` in `namespace` is complete and in the cache."""
        self._listed.add((kind, namespace))
        self._unlisted.discard((kind, namespace))
        self._check()

    def waiting_for(self) -> dict[KindKey, int]:
        """By kind, the namespaces (or the one cluster-wide listing) still to be listed."""
        out: dict[KindKey, int] = {}
        for kind, _ in self._unlisted:
            out[kind] = out.get(kind, 0) + 1
        return out

    def _check(self) -> None:
        if self._unlisted or self.open or not self._expecting:
            return
        self.open = True
        self._listed.clear()
        self._opened.set()

    async def wait(self) -> None:
        await self._opened.wait()
