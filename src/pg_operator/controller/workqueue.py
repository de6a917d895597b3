"""Per-key work queue (a cluster, a Backup …; controller/loop.py drives one per reconciler): one reconcile at
a time per key, many keys concurrently, wake-ups coalesced.

Semantics (like client-go's workqueue):
- `add(key)` marks the key dirty. A dirty key that is not being processed sits in the queue once,
  however many times it was added. A key added while being processed runs again right after.
- `add_after(key, delay)` adds it later; an earlier pending time wins over a later one.
- `workers` coroutines take keys and call the handler; a key is never processed by two workers at once.

Three lanes instead of one FIFO, by what the key's last reconcile said (the handler's answer):
- "settled": it found the key converged. A change to a running cluster must not wait behind a burst of
  hundreds of new clusters, each a dozen writes.
- "underway": it acted on the key (wrote its children, met a problem, or failed and will be retried)
  without converging. Its next reconcile, most often the one that finds the pods ready and reports Ready,
  would otherwise wait behind every new cluster's first reconcile: at 1000 new clusters the Ready count
  stayed near zero for minutes and then jumped.
- "new": no reconcile has acted on it yet (nor found it: a wake-up that came before its object, or one for an
  object that is gone).
Each lane is FIFO and is served before the ones below it, except that a lane whose keys have waited
through `burst` picks in a row from the lanes above it takes the next pick, so no lane starves: new keys
keep at least 1/(burst+1) of the picks.

"Settled" and "underway" come from the handler, not from having been processed: at 1000 clusters every
key had been processed once before its cluster existed (its claims' wake-ups found no cluster), which
would have put the whole burst in a priority lane.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Generic, Literal, TypeVar

K = TypeVar("K", bound=Hashable)
log = logging.getLogger(__name__)

Lane = Literal["settled", "underway", "new"]
LANES: tuple[Lane, ...] = ("settled", "underway", "new")


def next_lane(waiting: Mapping[Lane, int], passed_over: Mapping[Lane, int], burst: int) -> Lane | None:
    """Which lane the next key comes from: the first lane with a key waiting, unless a lower one has been
    passed over `burst` times in a row while it waited (the lowest such first); None when all are empty.
    `passed_over[lane]`: picks from the lanes above `lane` since it was last served, while it waited."""
    for lane in reversed(LANES):
        if waiting[lane] and passed_over[lane] >= burst:
            return lane
    return next((lane for lane in LANES if waiting[lane]), None)


def passed_over_after(
    picked: Lane, waiting: Mapping[Lane, int], passed_over: Mapping[Lane, int]
) -> dict[Lane, int]:
    """The counts after a pick from `picked`: it is reset, every lower lane with a key waiting gains one."""
    rank = LANES.index(picked)
    out: dict[Lane, int] = {}
    for i, lane in enumerate(LANES):
        if lane == picked:
            out[lane] = 0
        elif i > rank and waiting[lane]:
            out[lane] = passed_over[lane] + 1
        else:
            out[lane] = passed_over[lane]
    return out


class WorkQueue(Generic[K]):
    def __init__(self, *, burst: int = 4, max_remembered: int = 200_000) -> None:
        self._lanes: dict[Lane, deque[K]] = {lane: deque() for lane in LANES}
        self._nonempty = asyncio.Event()
        self._passed_over: dict[Lane, int] = dict.fromkeys(LANES, 0)
        self._burst = burst
        # The lane of every key whose last reconcile put it in a priority lane (insertion-ordered; pruned
        # oldest first past max_remembered, which only costs a forgotten key its priority once).
        self._lane_of: dict[K, Lane] = {}
        self._max_remembered = max_remembered
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
        self._lanes[self._lane_of.get(key, "new")].append(key)
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
            waiting = self.waiting()
            lane = next_lane(waiting, self._passed_over, self._burst)
            if lane is not None:
                break
            self._nonempty.clear()
            await self._nonempty.wait()
        self._passed_over = passed_over_after(lane, waiting, self._passed_over)
        key = self._lanes[lane].popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K, lane: Lane = "new") -> None:
        """The key's pass is over; `lane`: what the reconcile said of it (the module doc), the lane its next
        pass, a change or a resync, waits in."""
        self._processing.discard(key)
        self._lane_of.pop(key, None)
        if lane != "new":
            self._lane_of[key] = lane
            if len(self._lane_of) > self._max_remembered:
                for old in list(itertools.islice(self._lane_of, len(self._lane_of) // 2)):
                    del self._lane_of[old]
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

    async def run_workers(self, handler: Callable[[K], Awaitable[Lane | None]], workers: int) -> None:
        """`handler(key)` returns the lane the key's next reconcile waits in (None: "new"; see the module
        doc)."""

        async def worker() -> None:
            while True:
                key = await self.get()
                lane: Lane | None = None
                try:
                    lane = await handler(key)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the handler owns retries; a bug must not kill the worker
                    log.exception("reconcile handler crashed for %s", key)
                finally:
                    self.done(key, lane or "new")

        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.run_timers())
            for _ in range(workers):
                tg.create_task(worker())
