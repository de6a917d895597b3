"""Per-key work queue (a cluster, a Backup …; controller/loop.py drives one per reconciler): one pass at a
time per key, many keys concurrently, wake-ups coalesced.

Semantics (like client-go's workqueue):
- `add(key)` marks the key dirty. A dirty key that is not being processed sits in the queue once,
  however many times it was added. A key added while being processed runs again right after.
- `add_after(key, delay)` adds it later; an earlier pending time wins over a later one.
- `workers` coroutines take keys and call the handler; a key is never processed by two workers at once.

Two lanes instead of one FIFO: keys whose last pass found them settled (the handler returned True: a
cluster that had converged) and all others. During a burst of first passes — hundreds of new clusters,
each a dozen writes — a change to a cluster that is already running would otherwise wait behind all of
them. The settled lane goes first, but after `settled_burst` settled keys in a row a waiting key of the
other lane is taken, so new clusters keep at least 1/(settled_burst+1) of the picks and are never
starved. Each lane is FIFO. A handler that returns nothing (None) gets one FIFO, as before.

"Settled" comes from the handler, not from having been processed once: at 1000 clusters every key had
been processed once before its cluster existed (its claims' wake-ups found no cluster), which put the
whole burst into the priority lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Literal, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)

Lane = Literal["settled", "other"]


def next_lane(
    settled_waiting: int, other_waiting: int, settled_streak: int, settled_burst: int
) -> Lane | None:
    """Which lane the next key comes from: settled first, another key after `settled_burst` settled
    ones in a row (when one waits), None when both are empty."""
    if settled_waiting and (not other_waiting or settled_streak < settled_burst):
        return "settled"
    if other_waiting:
        return "other"
    return None


class WorkQueue(Generic[K]):
    def __init__(self, *, settled_burst: int = 4, max_settled: int = 200_000) -> None:
        self._lanes: dict[Lane, deque[K]] = {"settled": deque(), "other": deque()}
        self._nonempty = asyncio.Event()
        self._settled_streak = 0
        self._settled_burst = settled_burst
        # Keys whose last pass found them settled (insertion-ordered; pruned oldest first past
        # max_settled, which only costs a forgotten key its priority once).
        self._settled: dict[K, None] = {}
        self._max_settled = max_settled
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._timers: list[tuple[float, int, K]] = []
        self._due: dict[K, float] = {}
        self._seq = itertools.count()
        self._timer_wakeup = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._dirty)

    def waiting(self) -> dict[Lane, int]:
        """Keys waiting in each lane (not those being processed)."""
        return {lane: len(keys) for lane, keys in self._lanes.items()}

    def _enqueue(self, key: K) -> None:
        self._lanes["settled" if key in self._settled else "other"].append(key)
        self._nonempty.set()

    def add(self, key: K) -> None:
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._enqueue(key)

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
        while True:
            lane = next_lane(
                len(self._lanes["settled"]),
                len(self._lanes["other"]),
                self._settled_streak,
                self._settled_burst,
            )
            if lane is not None:
                break
            self._nonempty.clear()
            await self._nonempty.wait()
        self._settled_streak = self._settled_streak + 1 if lane == "settled" else 0
        key = self._lanes[lane].popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K, settled: bool = False) -> None:
        """The key's pass is over; `settled`: it found the key converged (its next pass, a change or a
        resync, takes the settled lane)."""
        self._processing.discard(key)
        self._settled.pop(key, None)
        if settled:
            self._settled[key] = None
            if len(self._settled) > self._max_settled:
                for old in list(itertools.islice(self._settled, len(self._settled) // 2)):
                    del self._settled[old]
        if key in self._dirty:
            self._enqueue(key)

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

    async def run_workers(self, handler: Callable[[K], Awaitable[bool | None]], workers: int) -> None:
        """`handler(key)` returns True when the pass found the key settled (see the module doc)."""

        async def worker() -> None:
            while True:
                key = await self.get()
                settled = False
                try:
                    settled = await handler(key) is True
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler owns retries; a bug must not kill the worker
                    log.exception("reconcile handler crashed for %s", key)
                finally:
                    self.done(key, settled)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.run_timers())
            for _ in range(workers):
                tg.create_task(worker())
