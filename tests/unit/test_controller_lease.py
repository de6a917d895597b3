"""The pure part of leader election: what a candidate does given what it saw and when."""

from __future__ import annotations

from pg_operator.controller.lease import Action, LeaseRecord, decide


def record(holder: str, duration: int = 15) -> LeaseRecord:
    return LeaseRecord(holder=holder, duration=duration, renew_time=None, transitions=3)


def test_no_lease_object_is_created() -> None:
    assert decide("me", None, 0.0, 100.0) is Action.CREATE


def test_our_own_lease_is_renewed_even_if_it_looks_expired() -> None:
    assert decide("me", record("me"), 0.0, 1000.0) is Action.RENEW


def test_a_live_lease_of_someone_else_is_respected() -> None:
    assert decide("me", record("other"), last_change=100.0, now=114.9) is Action.WAIT
    assert decide("me", record("other"), last_change=100.0, now=115.0) is Action.WAIT


def test_an_expired_lease_is_taken_judged_on_our_clock_since_it_last_changed() -> None:
    assert decide("me", record("other"), last_change=100.0, now=115.1) is Action.TAKE
    assert decide("me", record("other", duration=5), last_change=100.0, now=105.5) is Action.TAKE


def test_a_released_lease_is_taken_at_once() -> None:
    assert decide("me", record(""), last_change=100.0, now=100.0) is Action.TAKE
