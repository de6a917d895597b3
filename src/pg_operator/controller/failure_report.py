"""A cluster whose reconcile keeps failing says so: `Degraded=True` (reason `ReconcileFailed`) on its
status and a Warning Event, for any exception a reconcile raises, not only the causes the sub-reconcilers
handle.

When a failure is reported:
- at once when the API server refused the request (a 4xx other than 404 Not Found, 409 Conflict and
  429 Too Many Requests): an invalid child, a refused RBAC grant, a quota; the same request gets the same
  answer on every retry, so waiting would only hide it;
- after FAILURES_BEFORE_REPORT passes in a row for everything else (conflicts, throttling, 5xx, timeouts,
  a connection that broke, a bug): with the loop's backoff (0.5 s doubling) that is ≈ 8 s of failing, more
  than a conflict or an API server hiccup lasts, so those never flap the status.

The Event is rate-limited per cluster: posted when the reported message changes (at most once per
MIN_GAP_SECONDS), else once per EVENT_REPEAT_SECONDS while the same failure goes on (the loop retries up
to once a minute). The status is written when it does not say ReconcileFailed yet, and for a changed
message at most once per MIN_GAP_SECONDS: each write comes back as a watch event that wakes the cluster
past its backoff, so a message that differed on every attempt would otherwise retry without pause. A
pass that succeeds again clears the condition through the normal status path (`Recovered` Event) and
forgets the cluster here.

The status write merges: it sets the phase and the Degraded condition only, keeps every other condition
(the backup reconcilers' among them) as the cluster it read has them, and is conditional on that
cluster's resourceVersion, so it can never undo a write it has not seen; a conflict drops it (the next
retry reports again).

Messages name the object the API server refused (kind and name from its Status details) and its
message; a refusal about a Secret gives only the reason and code, so no Secret content can reach a
status or an Event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.kube_api import Api, PostgresClusterResource, is_conflict, is_not_found

log = logging.getLogger(__name__)

REASON = "ReconcileFailed"
PHASE = f"Degraded: {REASON}"
FAILURES_BEFORE_REPORT = 5
EVENT_REPEAT_SECONDS = 600.0
MIN_GAP_SECONDS = 30.0
MESSAGE_LIMIT = 1024
# 4xx answers a retry may well not get again.
TRANSIENT_CODES = frozenset({404, 409, 429})
SECRET_KINDS = frozenset({"secrets", "Secret"})


@dataclass(frozen=True)
class Failure:
    """What the status and the Event say about a failed pass."""

    message: str
    refused: bool  # the API server refused the request: reported on the first failure


def describe(exc: BaseException) -> Failure:
    """The failure's message: the object the API server refused and what it said, or the exception."""
    if isinstance(exc, ApiError) and exc.status is not None:
        status = exc.status
        code = int(status.code or 0)
        reason = str(status.reason or "Failure")
        details = status.details
        kind = str(details.kind or "") if details is not None else ""
        name = str(details.name or "") if details is not None else ""
        target = f"{kind} {name}".strip()
        said = f"{reason} ({code})" if kind in SECRET_KINDS else f"{reason} ({code}): {status.message or ''}"
        text = f"the API server refused {target}: {said}" if target else f"the API server answered {said}"
        return Failure(text[:MESSAGE_LIMIT], 400 <= code < 500 and code not in TRANSIENT_CODES)
    return Failure(f"{type(exc).__name__}: {exc}"[:MESSAGE_LIMIT], False)


def reportable(failure: Failure, failures_in_a_row: int) -> bool:
    return failure.refused or failures_in_a_row >= FAILURES_BEFORE_REPORT


def _stamp(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def failed_status(
    previous: Mapping[str, Any] | None, message: str, *, generation: int, now: datetime
) -> dict[str, Any]:
    """The status fields a failure report sets: the phase, and the conditions with Degraded replaced
    (its lastTransitionTime kept while it stays True) and every other one as it was, in its place."""
    conditions = [dict(c) for c in (previous or {}).get("conditions") or ()]
    since = _stamp(now)
    before = objects.condition(previous, "Degraded")
    if before and before.get("status") == "True" and before.get("lastTransitionTime"):
        since = str(before["lastTransitionTime"])
    degraded = {"type": "Degraded", "status": "True", "reason": REASON, "message": message,
                "observedGeneration": generation, "lastTransitionTime": since}  # fmt: skip
    at = next((i for i, c in enumerate(conditions) if c.get("type") == "Degraded"), None)
    if at is None:
        conditions.append(degraded)
    else:
        conditions[at] = degraded
    return {"phase": PHASE, "conditions": conditions}


def reported_failing(previous: Mapping[str, Any] | None) -> bool:
    """The status says ReconcileFailed already (with whichever message)."""
    degraded = objects.condition(previous, "Degraded") or {}
    return (
        str((previous or {}).get("phase") or "") == PHASE
        and degraded.get("status") == "True"
        and degraded.get("reason") == REASON
    )


def already_reported(previous: Mapping[str, Any] | None, message: str) -> bool:
    degraded = objects.condition(previous, "Degraded") or {}
    return reported_failing(previous) and degraded.get("message") == message


class EventLimiter:
    """Once per distinct message (but not within `gap` seconds of the last one), and again after
    `repeat` seconds of the same one."""

    def __init__(
        self,
        repeat: float = EVENT_REPEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        gap: float = MIN_GAP_SECONDS,
    ) -> None:
        self.repeat = repeat
        self.gap = gap
        self.clock = clock
        self._last: dict[ClusterKey, tuple[str, float]] = {}

    def allow(self, key: ClusterKey, message: str) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last[1] < (self.repeat if last[0] == message else self.gap):
            return False
        self._last[key] = (message, now)
        return True

    def forget(self, key: ClusterKey) -> None:
        self._last.pop(key, None)


class FailureReporter:
    """Reports a cluster's failed passes (called by the work loop after each one)."""

    def __init__(
        self,
        api: Api,
        events: EventRecorder,
        cluster: Callable[[ClusterKey], dict[str, Any] | None],
        limiter: EventLimiter | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.events = events
        self.cluster = cluster  # the cluster as the watch cache has it
        self.limiter = limiter or EventLimiter()
        self.wall_clock = wall_clock
        self._rewritten: dict[ClusterKey, float] = {}  # when the status last took a new message

    def succeeded(self, key: ClusterKey) -> None:
        self.limiter.forget(key)
        self._rewritten.pop(key, None)

    def _status_due(self, key: ClusterKey, previous: Mapping[str, Any], message: str) -> bool:
        if already_reported(previous, message):
            return False
        if not reported_failing(previous):
            return True
        last = self._rewritten.get(key)
        return last is None or self.limiter.clock() - last >= MIN_GAP_SECONDS

    async def failed(self, key: ClusterKey, exc: Exception, failures_in_a_row: int) -> int:
        """Writes made (0-2): the status when it does not say this yet, the Event when the limiter lets
        it through. Never raises: a report that fails is logged and tried again on the next failure."""
        failure = describe(exc)
        body = self.cluster(key)
        if not reportable(failure, failures_in_a_row) or body is None or objects.deleting(body):
            return 0
        writes = 0
        previous = objects.status(body)
        if self._status_due(key, previous, failure.message):
            fields = failed_status(
                previous, failure.message, generation=objects.generation(body), now=self.wall_clock()
            )
            patch = {"metadata": {"resourceVersion": objects.resource_version(body)}, "status": fields}
            try:
                await self.api.merge_patch(
                    PostgresClusterResource, key[1], key[0], patch, subresource_status=True
                )
                writes += 1
                self._rewritten[key] = self.limiter.clock()
            except ApiError as err:
                if not (is_conflict(err) or is_not_found(err)):
                    log.warning("could not report the failure of %s/%s: %s", key[0], key[1], err)
                return writes  # a newer cluster, or none: the next failure reports on what it shows
            except Exception as err:
                log.warning("could not report the failure of %s/%s: %s", key[0], key[1], err)
                return writes
        if self.limiter.allow(key, failure.message):
            writes += int(await self.events.record(body, "Warning", REASON, failure.message))
        return writes
