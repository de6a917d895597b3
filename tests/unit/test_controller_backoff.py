"""Retry delays and the per-cluster work queue (serialisation, coalescing, delayed adds)."""

from __future__ import annotations

import asyncio

from pg_operator.controller.backoff import Backoff, jittered
from pg_operator.controller.workqueue import WorkQueue


def test_backoff_doubles_and_is_capped() -> None:
    b = Backoff(base=0.5, cap=60.0, jitter=0.0)
    assert [b.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert b.delay(50) == 60.0
    assert b.delay(10_000) == 60.0
    assert b.delay(0) == 0.0


def test_backoff_jitter_stays_within_its_band_and_under_the_cap() -> None:
    b = Backoff(base=1.0, cap=10.0, jitter=0.5)
    assert b.delay(3, rand=0.0) == 3.0
    assert b.delay(3, rand=1.0) == 5.0
    assert b.delay(20, rand=1.0) == 10.0


def test_resync_interval_is_spread() -> None:
    assert jittered(300, 0.1, rand=0.0) == 270
    assert jittered(300, 0.1, rand=1.0) == 330


async def test_queue_coalesces_and_serialises_per_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    running: set[str] = set()
    calls: list[str] = []
    overlap = False
    gate = asyncio.Event()

    async def handler(key: str) -> None:
        nonlocal overlap
        overlap = overlap or key in running
        running.add(key)
        calls.append(key)
        if key == "a" and calls.count("a") == 1:
            await gate.wait()
        running.discard(key)

    task = asyncio.create_task(q.run_workers(handler, workers=4))
    for _ in range(5):
        q.add("a")
    q.add("b")
    await asyncio.sleep(0.05)
    assert calls.count("a") == 1 and calls.count("b") == 1  # five wake-ups of "a" ran once
    for _ in range(3):
        q.add("a")  # while "a" runs: coalesced into one more pass after it
    gate.set()
    await asyncio.sleep(0.05)
    assert calls.count("a") == 2
    assert not overlap
    q.close()
    task.cancel()


async def test_delayed_add_fires_and_earlier_time_wins() -> None:
    q: WorkQueue[str] = WorkQueue()
    calls: list[str] = []

    async def handler(key: str) -> None:
        calls.append(key)

    task = asyncio.create_task(q.run_workers(handler, workers=1))
    q.add_after("k", 5.0)
    q.add_after("k", 0.05)  # earlier wins
    q.add_after("k", 10.0)  # later is ignored while an earlier one is pending
    assert (q.pending_delay("k") or 99) < 1
    await asyncio.sleep(0.2)
    assert calls == ["k"]
    assert q.pending_delay("k") is None
    q.close()
    task.cancel()
