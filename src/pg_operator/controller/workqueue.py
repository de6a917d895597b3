"""Per-cluster work queue: one reconcile at a time per key, many keys concurrently, wake-ups coalesced.

Semantics (like client-go's workqueue):
- `add(key)` marks the key dirty. A dirty key that is not being processed sits in the queue once,
  however many times it was added. A key added while being processed runs again right after.
- `add_after(key, delay)` adds it later; an earlier pending time wins over a later one.
- `workers` coroutines take keys and call the handler; a key is never processed by two workers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._seq = itertools.count()
        self._timer_wakeup = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: K) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        when = asyncio.get_running_loop().time() + delay
        current = self._due.get(key)
        if current is not None and current <= when:
            return
        self._due[key] = when
        heapq.heappush(self._timers, (when, next(self._seq), key))
        self._timer_wakeup.set()

    def pending_delay(self, key: K) -> float | None:
        """Seconds until the key's scheduled add fires, or None when none is scheduled."""
        due = self._due.get(key)
        return None if due is None else max(0.0, due - asyncio.get_running_loop().time())

    async def get(self) -> K:
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.put_nowait(key)

    async def run_timers(self) -> None:
        """Move due delayed keys into the queue; run as one task."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            now = loop.time()
            while self._timers and self._timers[0][0] <= now:
                when, _, key = heapq.heappop(self._timers)
                if self._due.get(key) == when:
                    del self._due[key]
                    self.add(key)
            timeout = self._timers[0][0] - now if self._timers else None
            self._timer_wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wakeup.wait(), timeout)

    def close(self) -> None:
        self._closed = True
        self._timer_wakeup.set()

    async def run_workers(self, handler: Callable[[K], Awaitable[None]], workers: int) -> None:
        async def worker() -> None:
            while True:
                key = await self.get()
                try:
                    await handler(key)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler owns retries; a bug must not kill the worker
                    log.exception("reconcile handler crashed for %s", key)
                finally:
                    self.done(key)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.run_timers())
            for _ in range(workers):
                tg.create_task(worker())
