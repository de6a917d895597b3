"""Secrets read by name: the ones a cluster came to read after the watch cache left them out.

The cache keeps a labelled Secret only while a reconcile reads it (cache_admission.py). A Secret that is
there before its cluster names it (a password Secret made first, then `spec.roles` changed) was left out
when it came, so once the cluster's spec names it the cache has it read, once, by name; from then on it
is held and the watch keeps it fresh. No pass reads a Secret: a read follows only a change of what the
cluster reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Secret

from pg_operator.controller.keys import ClusterKey

log = logging.getLogger(__name__)

# Takes a Secret read by name as the watch would have delivered it.
Deliver = Callable[[dict[str, Any]], None]
# Reads one Secret: (namespace, name) -> its body, None when it is not there.
Read = Callable[[str, str], Awaitable[dict[str, Any] | None]]


def api_reader(api: Any) -> Read:
    """A `Read` through the controller's `Api` (its GETs are counted like every request)."""

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            secret = await api.get(Secret, name, namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        body: dict[str, Any] = secret.to_dict()
        body["apiVersion"], body["kind"] = "v1", "Secret"
        return body

    return read


class SecretReader:
    """Reads the named Secrets of a cluster in a task of its own and hands each to `deliver`."""

    def __init__(self, read: Read, deliver: Deliver) -> None:
        self._read = read
        self._deliver = deliver
        self._tasks: set[asyncio.Task[None]] = set()

    def read(self, key: ClusterKey, names: Iterable[str], then: Callable[[], None] | None = None) -> None:
        """Read `names` and deliver each found; `then` runs after the last, whatever each read gave."""
        task = asyncio.get_running_loop().create_task(self._read_all(key, sorted(names), then))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read_all(self, key: ClusterKey, names: list[str], then: Callable[[], None] | None) -> None:
        try:
            await self._read_each(key, names)
        finally:
            if then is not None:
                then()

    async def _read_each(self, key: ClusterKey, names: list[str]) -> None:
        namespace, cluster = key
        for name in names:
            try:
                body = await self._read(namespace, name)
            except Exception as exc:
                # The cluster's sub-reconciler reports the Secret as missing; the next change of it (an event)
                # or of the spec brings it in.
                log.warning("reading Secret %s/%s for cluster %s failed: %s: %s", namespace, name, cluster,
                            type(exc).__name__, exc)  # fmt: skip
                continue
            if body is not None:
                self._deliver(body)

    async def drain(self) -> None:
        """Wait for the reads under way (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
