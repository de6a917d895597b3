"""Drives reconciles: wake-ups in, per-cluster serialised passes out, retries and periodic resyncs."""

from __future__ import annotations

import asyncio
import logging

from lightkube.core.exceptions import ApiError

from pg_operator.controller.backoff import Backoff, jittered
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.metrics import Metrics
from pg_operator.controller.reconcile import Outcome, Reconciler, namespace_terminating
from pg_operator.controller.workqueue import WorkQueue

log = logging.getLogger(__name__)


def result_label(outcome: Outcome) -> str:
    if outcome.problem is not None:
        return "problem"
    return "changed" if outcome.writes else "noop"


class ReconcileLoop:
    def __init__(
        self,
        reconciler: Reconciler,
        metrics: Metrics,
        *,
        workers: int = 8,
        resync_seconds: float = 300.0,
        backoff: Backoff | None = None,
        status_delay: float = 1.0,
    ) -> None:
        self.reconciler = reconciler
        self.metrics = metrics
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.backoff = backoff or Backoff()
        self.status_delay = status_delay
        self.queue: WorkQueue[ClusterKey] = WorkQueue()
        self.failures: dict[ClusterKey, int] = {}

    def wake(self, key: ClusterKey) -> None:
        self.queue.add(key)
        self.metrics.queue_depth.set(len(self.queue))

    def wake_soon(self, key: ClusterKey) -> None:
        """For status-only news (pods, StatefulSet status): a burst of such events, e.g. instances
        becoming ready one by one, is folded into one pass and one status write."""
        self.queue.add_after(key, self.status_delay)

    async def handle(self, key: ClusterKey) -> bool:
        """One pass; True when it found the cluster converged (no write, no problem): the work queue
        then puts its next pass ahead of a burst of new clusters."""
        self.metrics.queue_depth.set(len(self.queue))
        try:
            outcome = await self.reconciler.reconcile(key)
        except asyncio.CancelledError:
            raise
        except ApiError as exc:
            if not namespace_terminating(exc):
                self._failed(key, exc)
                return False
            # Its namespace is being deleted, the cluster with it: nothing to repair, nothing to retry.
            log.info("not reconciling %s/%s: its namespace is being deleted", key[0], key[1])
            self.failures.pop(key, None)
            self.metrics.reconciles.labels(result="gone").inc()
            return False
        except Exception as exc:
            self._failed(key, exc)
            return False
        self.failures.pop(key, None)
        self.metrics.reconciles.labels(result=result_label(outcome)).inc()
        if outcome.writes:
            log.info("reconciled %s/%s: %d write(s), phase %r", key[0], key[1], outcome.writes, outcome.phase)
        if not outcome.gone:
            self.queue.add_after(key, jittered(self.resync_seconds))
        return not outcome.gone and outcome.writes == 0 and outcome.problem is None

    def _failed(self, key: ClusterKey, exc: Exception) -> None:
        """Retry with capped exponential backoff and jitter."""
        failures = self.failures.get(key, 0) + 1
        self.failures[key] = failures
        delay = self.backoff.delay(failures)
        self.metrics.reconciles.labels(result="error").inc()
        log.warning(
            "reconcile of %s/%s failed (%d in a row), retrying in %.1fs: %s: %s",
            key[0],
            key[1],
            failures,
            delay,
            type(exc).__name__,
            exc,
        )
        self.queue.add_after(key, delay)

    async def run(self) -> None:
        await self.queue.run_workers(self.handle, self.workers)
