"""Retry delays, the per-key work queue (serialisation, coalescing, delayed adds) and the loop that
drives every reconciler on them (retries, final failures, requeues, resyncs, metrics)."""

from __future__ import annotations

import asyncio

import pytest

from pg_operator.controller.backoff import Backoff, jittered
from pg_operator.controller.loop import (
    STATUS_FOLD_MAX,
    Outcome,
    ReconcileLoop,
    Result,
    result_label,
    status_fold,
)
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.reconcile import Outcome as ClusterOutcome
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


# --- the generic ReconcileLoop: retries, final failures, requeues, resyncs, metrics ------------------


class Scripted:
    """A reconciler that plays back a script of outcomes (an exception is raised)."""

    def __init__(self, *script: Result | Exception) -> None:
        self.script = list(script)
        self.keys: list[tuple[str, str]] = []

    async def reconcile(self, key: tuple[str, str]) -> Result:
        self.keys.append(key)
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def counted(metrics: Metrics, result: str) -> float:
    return float(metrics.reconciles.labels(result=result)._value.get())


KEY = ("ns", "db")


async def test_failures_retry_with_growing_backoff_and_a_success_resets_the_count() -> None:
    metrics = Metrics()
    reconciler = Scripted(RuntimeError("one"), RuntimeError("two"), Result(writes=2), Result())
    loop = ReconcileLoop(reconciler, metrics, backoff=Backoff(base=10.0, cap=60.0, jitter=0.0))
    assert await loop.handle(KEY) == "underway"  # its retry need not wait behind new keys
    assert loop.failures[KEY] == 1 and loop.queue.pending_delay(KEY) == pytest.approx(10.0, abs=0.1)
    assert await loop.handle(KEY) == "underway"
    assert loop.failures[KEY] == 2 and loop.queue.pending_delay(KEY) == pytest.approx(10.0, abs=0.1)
    assert await loop.handle(KEY) == "underway"  # wrote: not settled
    assert KEY not in loop.failures
    assert await loop.handle(KEY) == "settled"  # found as wanted
    assert [counted(metrics, r) for r in ("error", "changed", "noop")] == [2, 1, 1]


async def test_the_second_failure_waits_twice_as_long() -> None:
    loop = ReconcileLoop(Scripted(RuntimeError("x"), RuntimeError("x")),
                         backoff=Backoff(base=1.0, cap=60.0, jitter=0.0), resync_seconds=None)  # fmt: skip
    await loop.handle(KEY)
    first = loop.queue.pending_delay(KEY)
    loop.queue = type(loop.queue)()  # forget the pending retry, so the next delay shows alone
    await loop.handle(KEY)
    assert first == pytest.approx(1.0, abs=0.1)
    assert loop.queue.pending_delay(KEY) == pytest.approx(2.0, abs=0.1)


async def test_a_final_failure_is_counted_gone_and_not_retried() -> None:
    metrics = Metrics()

    def gives_up(exc: Exception) -> str | None:
        return "its namespace is being deleted" if "going" in str(exc) else None

    loop = ReconcileLoop(Scripted(RuntimeError("namespace going")), metrics, gives_up=gives_up)
    assert await loop.handle(KEY) == "new"
    assert loop.queue.pending_delay(KEY) is None and KEY not in loop.failures
    assert counted(metrics, "gone") == 1 and counted(metrics, "error") == 0


async def test_requeue_after_resync_and_gone() -> None:
    resyncing = ReconcileLoop(Scripted(Result(), Result(gone=True)), resync_seconds=100.0)
    await resyncing.handle(KEY)
    assert 89 < (resyncing.queue.pending_delay(KEY) or 0) < 111  # jittered resync
    resyncing.queue = type(resyncing.queue)()
    assert await resyncing.handle(KEY) == "new"
    assert resyncing.queue.pending_delay(KEY) is None  # gone: no resync

    polling = ReconcileLoop(Scripted(Result(requeue_after=5.0), Result()), resync_seconds=None)
    assert await polling.handle(KEY) == "underway"  # coming back for something: not settled
    assert polling.queue.pending_delay(KEY) == pytest.approx(5.0, abs=0.1)
    polling.queue = type(polling.queue)()
    assert await polling.handle(KEY) == "settled"
    assert polling.queue.pending_delay(KEY) is None  # no resync, nothing asked for


async def test_a_problem_is_counted_apart_and_not_settled() -> None:
    metrics = Metrics()
    loop = ReconcileLoop(Scripted(Result(problem="bad spec")), metrics)
    assert await loop.handle(KEY) == "underway"
    assert counted(metrics, "problem") == 1 and KEY not in loop.failures


def test_the_cluster_reconcilers_outcome_is_a_loop_outcome() -> None:
    outcome: Outcome = ClusterOutcome(writes=1, phase="Running")
    assert (outcome.writes, outcome.requeue_after, result_label(outcome)) == (1, None, "changed")


def test_status_news_is_folded_longer_only_while_a_backlog_waits() -> None:
    assert status_fold(1.0, queued=0, workers=16) == 1.0  # steady state: as before
    assert status_fold(1.0, queued=64, workers=16) == 1.0  # four keys a worker: still the floor
    assert status_fold(1.0, queued=320, workers=16) == 5.0
    assert status_fold(1.0, queued=1000, workers=16) == STATUS_FOLD_MAX  # capped
    assert status_fold(2.5, queued=10, workers=0) == 2.5  # no division by zero


async def test_a_status_wake_up_during_a_backlog_waits_for_more_news() -> None:
    loop = ReconcileLoop(Scripted(), workers=2, resync_seconds=None, status_delay=1.0)
    for i in range(40):
        loop.wake(("ns", f"c{i}"))
    loop.wake_soon(KEY)
    assert loop.queue.pending_delay(KEY) == pytest.approx(5.0, abs=0.1)
