"""Reporting a cluster whose reconcile keeps failing: which failures count at once and which only in a
row, the message (what was refused, never a Secret's content), the status fields merged into the
others, the Event once per message, and the work loop calling the report after each failed pass."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from lightkube.core.exceptions import ApiError
from lightkube.models import meta_v1

from harness import objects
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.failure_report import (
    FAILURES_BEFORE_REPORT,
    PHASE,
    REASON,
    EventLimiter,
    FailureReporter,
    already_reported,
    describe,
    failed_status,
    reportable,
)
from pg_operator.controller.kube_api import Api
from pg_operator.controller.loop import ReconcileLoop, Result

KEY = ("shop", "db")
NOW = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC)


def api_error(code: int, reason: str, message: str, kind: str = "", name: str = "") -> ApiError:
    details = {"kind": kind, "name": name, "group": "apps"} if kind else None
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
              "message": message, "details": details}  # fmt: skip
    return ApiError(status=meta_v1.Status.from_dict(status))


QUOTA = api_error(
    403, "Forbidden",
    'statefulsets.apps "db" is forbidden: exceeded quota: no-sts, requested: count/statefulsets.apps=1, '
    "used: count/statefulsets.apps=0, limited: count/statefulsets.apps=0",
    "statefulsets", "db",
)  # fmt: skip


def test_a_refusal_names_the_object_and_what_the_api_server_said_and_counts_at_once() -> None:
    failure = describe(QUOTA)
    assert failure.refused
    assert failure.message.startswith("the API server refused statefulsets db: Forbidden (403): ")
    assert "exceeded quota: no-sts" in failure.message
    said = 'StatefulSet.apps "db" is invalid: spec.x: Invalid'
    invalid = describe(api_error(422, "Invalid", said, "StatefulSet", "db"))
    assert invalid.refused and "StatefulSet db: Invalid (422)" in invalid.message


def test_transient_answers_and_other_exceptions_count_only_in_a_row() -> None:
    for exc in (
        api_error(409, "Conflict", "the object has been modified", "statefulsets", "db"),
        api_error(429, "TooManyRequests", "slow down"),
        api_error(404, "NotFound", 'services "db-rw" not found', "services", "db-rw"),
        api_error(500, "InternalError", "etcdserver: request timed out"),
        ConnectionResetError("connection reset by peer"),
    ):
        failure = describe(exc)
        assert not failure.refused, exc
        assert not reportable(failure, FAILURES_BEFORE_REPORT - 1)
        assert reportable(failure, FAILURES_BEFORE_REPORT)
    assert describe(KeyError("spec")).message == "KeyError: 'spec'"
    assert describe(api_error(500, "InternalError", "boom")).message == (
        "the API server answered InternalError (500): boom"
    )


def test_a_refused_secret_reports_the_reason_only() -> None:
    said = 'Secret "db-app" is invalid: data[password]: "hunter2"'
    secret = api_error(422, "Invalid", said, "secrets", "db-app")
    failure = describe(secret)
    assert failure.message == "the API server refused secrets db-app: Invalid (422)"
    assert "hunter2" not in failure.message


def test_long_messages_are_cut() -> None:
    assert len(describe(RuntimeError("x" * 5000)).message) == 1024


CONDITIONS = [
    {"type": "Ready", "status": "True", "reason": "AllInstancesReady", "message": "3 of 3",
     "observedGeneration": 1, "lastTransitionTime": "2026-11-30T00:00:00Z"},
    {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
     "observedGeneration": 1, "lastTransitionTime": "2026-11-30T00:00:00Z"},
    {"type": "ContinuousArchiving", "status": "True", "reason": "Archiving", "message": "ok",
     "observedGeneration": 1, "lastTransitionTime": "2026-11-30T01:00:00Z"},
]  # fmt: skip


def test_the_failure_sets_degraded_and_the_phase_and_keeps_every_other_condition_in_place() -> None:
    previous = {"phase": "Healthy", "conditions": CONDITIONS, "backup": {"lastBackup": "b-1"}}
    fields = failed_status(previous, "it broke", generation=2, now=NOW)
    assert set(fields) == {"phase", "conditions"}  # the merge patch leaves status.backup alone
    assert fields["phase"] == PHASE == "Degraded: ReconcileFailed"
    assert [c["type"] for c in fields["conditions"]] == ["Ready", "Degraded", "ContinuousArchiving"]
    assert fields["conditions"][0] == CONDITIONS[0] and fields["conditions"][2] == CONDITIONS[2]
    assert fields["conditions"][1] == {
        "type": "Degraded", "status": "True", "reason": REASON, "message": "it broke",
        "observedGeneration": 2, "lastTransitionTime": "2026-12-01T08:00:00Z",
    }  # fmt: skip
    later = failed_status({"conditions": fields["conditions"]}, "it broke otherwise", generation=2,
                          now=NOW.replace(hour=9))  # fmt: skip
    assert later["conditions"][1]["lastTransitionTime"] == "2026-12-01T08:00:00Z"  # still True since then
    assert already_reported(fields, "it broke") and not already_reported(fields, "it broke otherwise")
    assert [c["type"] for c in failed_status(None, "x", generation=1, now=NOW)["conditions"]] == ["Degraded"]


def test_the_event_is_posted_once_per_message_and_again_after_the_repeat_interval() -> None:
    t = [0.0]
    limiter = EventLimiter(repeat=600.0, clock=lambda: t[0])
    assert limiter.allow(KEY, "a")
    t[0] = 60.0
    assert not limiter.allow(KEY, "a")
    assert limiter.allow(("shop", "other"), "a")  # per cluster
    assert limiter.allow(KEY, "b")  # a new message
    t[0] = 70.0
    assert not limiter.allow(KEY, "b")
    assert not limiter.allow(KEY, "c")  # a new message, but within 30 s of the last Event
    t[0] = 95.0
    assert limiter.allow(KEY, "c")
    t[0] = 600.0
    assert not limiter.allow(KEY, "c")
    t[0] = 700.0
    assert limiter.allow(KEY, "c")  # the same failure, ten minutes on
    limiter.forget(KEY)
    assert limiter.allow(KEY, "c")  # it succeeded meanwhile: a new failure is news


class Recorder:
    """Stands in for the operator's Api (the status patches) and EventRecorder (the Events)."""

    def __init__(self, patch_error: Exception | None = None) -> None:
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.patch_error = patch_error

    async def merge_patch(
        self, res: Any, name: str, namespace: str, patch: dict[str, Any], **kw: Any
    ) -> None:
        assert kw == {"subresource_status": True} and (namespace, name) == KEY
        if self.patch_error is not None:
            raise self.patch_error
        self.patches.append(patch)

    async def record(self, body: dict[str, Any], event_type: str, reason: str, message: str) -> bool:
        self.events.append((event_type, reason, message))
        return True


def cluster(status: dict[str, Any] | None = None, rv: str = "7", **meta: Any) -> dict[str, Any]:
    body = objects.cluster("db", metadata={"uid": "u1", "generation": 2, "resourceVersion": rv, **meta})
    body["status"] = status or {"phase": "Healthy", "conditions": CONDITIONS}
    return body


def reporter(
    rec: Recorder, body: dict[str, Any] | None, limiter: EventLimiter | None = None
) -> FailureReporter:
    return FailureReporter(cast(Api, rec), cast(EventRecorder, rec), lambda key: body, limiter,
                           wall_clock=lambda: NOW)  # fmt: skip


async def test_a_refusal_writes_a_conditional_status_merge_and_a_warning() -> None:
    rec = Recorder()
    assert await reporter(rec, cluster()).failed(KEY, QUOTA, 1) == 2
    (patch,) = rec.patches
    assert patch["metadata"] == {"resourceVersion": "7"}  # conditional on the copy it merged into
    assert patch["status"]["phase"] == PHASE
    assert [c["type"] for c in patch["status"]["conditions"]] == ["Ready", "Degraded", "ContinuousArchiving"]
    assert rec.events == [("Warning", REASON, describe(QUOTA).message)]


async def test_a_status_that_says_so_already_is_not_written_again_and_the_event_waits() -> None:
    rec = Recorder()
    fields = failed_status(cluster()["status"], describe(QUOTA).message, generation=2, now=NOW)
    r = reporter(rec, cluster(fields))
    assert await r.failed(KEY, QUOTA, 1) == 1  # the Event only: the status says it already
    assert await r.failed(KEY, QUOTA, 2) == 0
    assert rec.patches == [] and len(rec.events) == 1


async def test_a_lost_race_or_a_gone_cluster_writes_nothing_and_raises_nothing() -> None:
    conflict = Recorder(api_error(409, "Conflict", "the object has been modified"))
    assert await reporter(conflict, cluster()).failed(KEY, QUOTA, 1) == 0
    assert conflict.events == []  # reported with the status on the next retry
    nothing = Recorder()
    assert await reporter(nothing, None).failed(KEY, QUOTA, 1) == 0
    deleting = reporter(nothing, cluster(deletionTimestamp="2026-12-01T08:00:00Z"))
    assert await deleting.failed(KEY, QUOTA, 1) == 0
    assert nothing.patches == [] and nothing.events == []


class Failing:
    """A cluster reconciler whose passes raise `errors` one after the other, then succeed."""

    def __init__(self, reporter: FailureReporter, *errors: Exception) -> None:
        self.errors = list(errors)
        self.reporter = reporter

    async def reconcile(self, key: tuple[str, str]) -> Result:
        if self.errors:
            raise self.errors.pop(0)
        self.reporter.succeeded(key)
        return Result()

    async def report_failure(self, key: tuple[str, str], exc: Exception, failures: int) -> int:
        return await self.reporter.failed(key, exc, failures)


def failing_loop(rec: Recorder, *errors: Exception) -> tuple[ReconcileLoop[tuple[str, str]], Failing]:
    reconciler = Failing(reporter(rec, cluster()), *errors)
    loop = ReconcileLoop(reconciler, backoff=Backoff(jitter=0.0), resync_seconds=None,
                         on_failure=reconciler.report_failure)  # fmt: skip
    return loop, reconciler


async def test_the_loop_reports_transient_failures_only_after_enough_in_a_row() -> None:
    rec = Recorder()
    conflict = api_error(409, "Conflict", "the object has been modified", "statefulsets", "db")
    loop, _ = failing_loop(rec, *[conflict] * (FAILURES_BEFORE_REPORT - 1), Exception("x"))
    for _ in range(FAILURES_BEFORE_REPORT - 1):
        await loop.handle(KEY)
    assert rec.patches == [] and rec.events == []  # a few conflicts never touch the status
    await loop.handle(KEY)  # a fifth failure in a row, of any kind
    assert len(rec.patches) == 1 and rec.events == [("Warning", REASON, "Exception: x")]


async def test_the_loop_reports_a_refusal_at_once_and_its_event_once_across_retries() -> None:
    rec = Recorder()
    loop, _ = failing_loop(rec, *[QUOTA] * 10)
    for _ in range(10):
        await loop.handle(KEY)
    assert len(rec.events) == 1  # not one per retry
    assert len(rec.patches) == 10  # the stub's cluster never shows the write; the real cache does
    assert loop.failures[KEY] == 10


async def test_a_success_forgets_the_failure_so_the_next_one_is_news() -> None:
    rec = Recorder()
    loop, reconciler = failing_loop(rec, QUOTA)
    await loop.handle(KEY)
    assert await loop.handle(KEY) == "settled" and KEY not in loop.failures
    reconciler.errors.append(QUOTA)
    await loop.handle(KEY)
    assert len(rec.events) == 2


async def test_a_report_that_raises_does_not_break_the_loop() -> None:
    async def broken(key: tuple[str, str], exc: Exception, failures: int) -> None:
        raise RuntimeError("report failed")

    class Raising:
        async def reconcile(self, key: tuple[str, str]) -> Result:
            raise ValueError("pass failed")

    loop = ReconcileLoop(Raising(), backoff=Backoff(jitter=0.0), resync_seconds=None, on_failure=broken)
    assert await loop.handle(KEY) == "underway"
    assert loop.failures[KEY] == 1 and loop.queue.pending_delay(KEY) is not None  # retried as before


async def test_a_message_that_changes_on_every_attempt_is_written_and_posted_at_most_every_30_s() -> None:
    """Each status write wakes the cluster at once (its watch event): a new message per attempt must not
    turn the backoff into a tight loop of writes."""
    t = [0.0]
    rec = Recorder()
    body = cluster()
    r = reporter(rec, body, EventLimiter(clock=lambda: t[0]))
    assert await r.failed(KEY, RuntimeError("attempt 1"), 5) == 2
    body["status"] = failed_status(body["status"], "RuntimeError: attempt 1", generation=2, now=NOW)
    t[0] = 10.0
    assert await r.failed(KEY, RuntimeError("attempt 2"), 6) == 0
    t[0] = 31.0
    assert await r.failed(KEY, RuntimeError("attempt 3"), 7) == 2
    assert [p["status"]["conditions"][1]["message"] for p in rec.patches] == [
        "RuntimeError: attempt 1",
        "RuntimeError: attempt 3",
    ]
    assert len(rec.events) == 2
