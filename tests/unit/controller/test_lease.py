"""The pure part of leader election: what a candidate does given what it saw and when."""

from __future__ import annotations

from pg_operator.controller.lease import Action, LeaseRecord, Renewal, decide, plan_renewal


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


# --- the holder's side: keep renewing until the lease could have expired by our own clock -------------

PERIODS = {"duration": 15.0, "margin": 2.0, "renew_period": 2.0, "retry_period": 0.5}


def test_a_healthy_holder_renews_every_period_with_the_rest_of_its_lease_as_timeout() -> None:
    plan = plan_renewal(100.0, 100.0, failed=False, **PERIODS)
    assert plan == Renewal(lost=False, delay=2.0, timeout=11.0)  # valid until 113, asked at 102


def test_one_slow_or_failed_renewal_is_not_a_lost_lease() -> None:
    # The old rule gave up 10 s after the last success; our lease is ours until 100 + 15, less the margin.
    plan = plan_renewal(111.0, 100.0, failed=True, **PERIODS)
    assert not plan.lost
    assert plan.delay == 0.5 and plan.timeout == 1.5


def test_a_failure_is_retried_sooner_than_the_renew_period() -> None:
    assert plan_renewal(104.0, 100.0, failed=True, **PERIODS).delay == 0.5
    assert plan_renewal(104.0, 100.0, failed=False, **PERIODS).delay == 2.0


def test_the_wait_never_runs_past_the_lease() -> None:
    plan = plan_renewal(112.5, 100.0, failed=False, **PERIODS)
    assert plan == Renewal(lost=False, delay=0.5, timeout=0.0)


def test_the_holder_stops_acting_before_anybody_else_may_take_over() -> None:
    # A candidate may take over once duration has passed since it saw our last write (>= when we sent
    # it); we stop `margin` earlier.
    assert plan_renewal(113.0, 100.0, failed=True, **PERIODS).lost
    assert plan_renewal(120.0, 100.0, failed=True, **PERIODS).lost
    assert not plan_renewal(112.9, 100.0, failed=True, **PERIODS).lost
