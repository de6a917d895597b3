"""The one runtime every reconciler runs on: wake-ups in, per-key serialised passes out, retries with
capped exponential backoff and jitter, periodic resyncs, metrics.

A reconciler is anything with `async reconcile(key) -> Outcome` (`Reconciler`); the loop knows nothing
of what a key names. The cluster reconciler (controller/reconcile.py) runs on one loop, each backup
reconciler (controller/backup_reconcilers) on a loop of its own, so a failing store or exec never
holds up a cluster's own reconcile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pg_operator.controller.backoff import Backoff, jittered
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.workqueue import Lane, WorkQueue

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)


class Outcome(Protocol):
    """What one reconcile says about its key (read-only; reconcile.Outcome and `Result` are two)."""

    @property
    def writes(self) -> int:
        """Requests that changed something (0: found as wanted)."""
        ...

    @property
    def problem(self) -> object | None:
        """Something only the user can fix (counted apart; the key is not retried for it)."""
        ...

    @property
    def gone(self) -> bool:
        """The object is gone: no resync for it."""
        ...

    @property
    def requeue_after(self) -> float | None:
        """Seconds until the next reconcile the key needs (a job to poll, a schedule), or None."""
        ...

    @property
    def phase(self) -> str | None:
        """A word for the log line of a reconcile that wrote, or None."""
        ...


@dataclass(frozen=True)
class Result:
    """An Outcome for reconcilers that need no more than these."""

    writes: int = 0
    problem: object | None = None
    gone: bool = False
    requeue_after: float | None = None
    phase: str | None = None


class Reconciler(Protocol[K_contra]):
    async def reconcile(self, key: K_contra) -> Outcome: ...


def result_label(outcome: Outcome) -> str:
    if outcome.problem is not None:
        return "problem"
    return "changed" if outcome.writes else "noop"


def key_text(key: Hashable) -> str:
    return "/".join(str(part) for part in key) if isinstance(key, tuple) else str(key)


def never_gives_up(exc: Exception) -> str | None:
    return None


# The longest a status-only wake-up is folded for while a backlog waits (status_fold).
STATUS_FOLD_MAX = 10.0


def status_fold(delay: float, queued: int, workers: int) -> float:
    """How long status-only news waits for more of its kind: `delay`, and while a backlog waits, longer
    in proportion to it (a second per four keys a worker has ahead of it, up to STATUS_FOLD_MAX). A pass
    costs the same whether it reports one pod's change or three; at 1000 new clusters (one run each,
    bench/results-reconcile-scale.md section 19) folding took the status writes from 2.26 to 2.11 a
    cluster and the operator's CPU from 181 to 172 s, on a machine whose API server is short of CPU."""
    return max(delay, min(STATUS_FOLD_MAX, queued / max(workers, 1) / 4))


class ReconcileLoop(Generic[K]):
    """`name` starts the retry log line ("reconcile of ns/db failed …"). `gives_up(exc)` names why a
    failure is final (the key is then dropped, counted "gone", not retried) or returns None. With
    `metrics` the reconciles are counted in pg_operator_reconcile_total{result} and the queue depth is kept;
    `resync_seconds` None: no periodic pass, only wake-ups and the outcomes' requeue_after.
    `on_failure(key, exc, failures_in_a_row)` is awaited after each failed pass that will be retried
    (the cluster loop reports it on the cluster: controller/failure_report.py); what it raises is logged."""

    def __init__(
        self,
        reconciler: Reconciler[K],
        metrics: Metrics | None = None,
        *,
        name: str = "reconcile",
        workers: int = 8,
        resync_seconds: float | None = 300.0,
        backoff: Backoff | None = None,
        status_delay: float = 1.0,
        gives_up: Callable[[Exception], str | None] = never_gives_up,
        on_failure: Callable[[K, Exception, int], Awaitable[object]] | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.metrics = metrics
        self.name = name
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.backoff = backoff or Backoff()
        self.status_delay = status_delay
        self.gives_up = gives_up
        self.on_failure = on_failure
        self.queue: WorkQueue[K] = WorkQueue()
        self.failures: dict[K, int] = {}

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.reconciles.labels(result=result).inc()

    def _depth(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self.queue))

    def wake(self, key: K) -> None:
        self.queue.add(key)
        self._depth()

    def wake_after(self, key: K, delay: float) -> None:
        self.queue.add_after(key, delay)

    def wake_soon(self, key: K) -> None:
        """For status-only news (pods, StatefulSet status): a burst of such events, e.g. instances
        becoming ready one by one, is folded into one reconcile and one status write."""
        self.queue.add_after(key, status_fold(self.status_delay, len(self.queue), self.workers))

    async def handle(self, key: K) -> Lane:
        """One pass; the work queue's lane for the key's next reconcile: "settled" when it found nothing to do
        (no write, no problem, nothing to come back for), "underway" when it acted on the key without
        converging or failed, "new" when the key is gone (the queue's module doc says why)."""
        self._depth()
        try:
            outcome = await self.reconciler.reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            why = self.gives_up(exc)
            if why is None:
                self._failed(key, exc)
                await self._report(key, exc)
                return "underway"  # its retry, after the backoff, need not wait behind new keys
            # E.g. its namespace is being deleted, the object with it: nothing to repair or retry.
            log.info("not reconciling %s: %s", key_text(key), why)
            self.failures.pop(key, None)
            self._count("gone")
            return "new"
        self.failures.pop(key, None)
        self._count(result_label(outcome))
        if outcome.writes:
            log.info("reconciled %s: %d write(s), phase %r", key_text(key), outcome.writes, outcome.phase)
        if outcome.gone:
            return "new"
        if outcome.requeue_after is not None:
            self.queue.add_after(key, outcome.requeue_after)
        if self.resync_seconds is not None:
            self.queue.add_after(key, jittered(self.resync_seconds))
        if outcome.writes == 0 and outcome.problem is None and outcome.requeue_after is None:
            return "settled"
        return "underway"

    def _failed(self, key: K, exc: Exception) -> None:
        """Retry with capped exponential backoff and jitter."""
        failures = self.failures.get(key, 0) + 1
        self.failures[key] = failures
        delay = self.backoff.delay(failures)
        self._count("error")
        log.warning(
            "%s of %s failed (%d in a row), retrying in %.1fs: %s: %s",
            self.name,
            key_text(key),
            failures,
            delay,
            type(exc).__name__,
            exc,
        )
        self.queue.add_after(key, delay)

    async def _report(self, key: K, exc: Exception) -> None:
        if self.on_failure is None:
            return
        try:
            await self.on_failure(key, exc, self.failures.get(key, 0))
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.warning("reporting the failure of %s failed: %s: %s", key_text(key), type(err).__name__, err)

    async def run(self) -> None:
        await self.queue.run_workers(self.handle, self.workers)

    def close(self) -> None:
        self.queue.close()
