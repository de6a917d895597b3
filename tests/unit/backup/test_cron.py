"""Cron schedules: parsing, next/last run, and the ScheduledBackup decision."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from pg_operator.api.schedule import SCHEDULE_PATTERN, parse
from pg_operator.backup import cron

UTC = dt.UTC


def at(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("0 3 * * *", at(2026, 12, 1, 2, 59), at(2026, 12, 1, 3, 0)),
        ("0 3 * * *", at(2026, 12, 1, 3, 0), at(2026, 12, 2, 3, 0)),  # strictly after
        ("*/15 * * * *", at(2026, 12, 1, 8, 1, 30), at(2026, 12, 1, 8, 15)),
        ("30 8-18/5 * * *", at(2026, 12, 1, 13, 31), at(2026, 12, 1, 18, 30)),
        ("0 0 * * 1-5", at(2026, 12, 4, 12, 0), at(2026, 12, 7, 0, 0)),  # Friday → Monday
        ("0 0 * * 7", at(2026, 12, 1, 0, 0), at(2026, 12, 6, 0, 0)),  # 7 is Sunday
        ("0 0 29 2 *", at(2026, 3, 1), at(2028, 2, 29)),  # leap day
        ("0 0 31 * *", at(2026, 4, 1), at(2026, 5, 31)),  # April has no 31st
        ("0 12 1 * 0", at(2026, 12, 1, 13, 0), at(2026, 12, 6, 12, 0)),  # dom OR dow when both are set
        ("@hourly", at(2026, 12, 1, 8, 59, 59), at(2026, 12, 1, 9, 0)),
        ("@weekly", at(2026, 12, 1), at(2026, 12, 6)),
        ("59 23 31 12 *", at(2026, 12, 31, 23, 59), at(2027, 12, 31, 23, 59)),
    ],
)
def test_next_run(schedule: str, after: dt.datetime, expected: dt.datetime) -> None:
    assert cron.next_run(schedule, after) == expected


def test_next_run_converts_other_zones_to_utc() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert cron.next_run("0 3 * * *", dt.datetime(2026, 12, 1, 6, 30, tzinfo=plus_two)) == at(
        2026, 12, 2, 3, 0
    )
    assert cron.next_run("0 3 * * *", dt.datetime(2026, 12, 1, 4, 30, tzinfo=plus_two)) == at(
        2026, 12, 1, 3, 0
    )


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        cron.next_run("0 3 * * *", dt.datetime(2026, 12, 1))


def test_last_run() -> None:
    assert cron.last_run("0 3 * * *", at(2026, 12, 1, 3, 0)) == at(2026, 12, 1, 3, 0)
    assert cron.last_run("0 3 * * *", at(2026, 12, 1, 2, 59)) == at(2026, 11, 30, 3, 0)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("61 * * * *", "minute '61' is outside 0-59"),
        ("0 24 * * *", "hour '24' is outside 0-23"),
        ("0 0 0 * *", "day of month '0' is outside 1-31"),
        ("0 0 * 13 *", "month '13' is outside 1-12"),
        ("0 0 * * 8", "day of week '8' is outside 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "step '0'"),
        ("0 3 * *", "must have 5 fields"),
        ("0 3 * * MON", "not a number"),
        ("0 0 30 2 *", "no month in it has"),
        ("@reboot", "must have 5 fields"),
    ],
)
def test_bad_schedules_name_the_field(schedule: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(schedule)


@pytest.mark.parametrize(
    "schedule",
    [
        "0 3 * * *",
        "*/15 8-18 * * 1-5",
        "0,30 * 1,15 * *",
        "@daily",
        "0 0 1 1 *",
        "5 4 * * 7",
        "0-59/10 * * * *",
    ],
)
def test_pattern_accepts_what_parse_accepts(schedule: str) -> None:
    parse(schedule)
    assert re.match(SCHEDULE_PATTERN, schedule)


@pytest.mark.parametrize(
    "schedule", ["61 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 8", "0 3 * *", "0 3 * * MON"]
)
def test_pattern_refuses_what_parse_refuses(schedule: str) -> None:
    assert not re.match(SCHEDULE_PATTERN, schedule)
    with pytest.raises(ValueError):
        parse(schedule)


class TestDecide:
    created = at(2026, 12, 1, 1, 0)

    def test_not_due_before_the_first_run(self) -> None:
        d = cron.decide("0 3 * * *", now=at(2026, 12, 1, 2, 0), created=self.created, last_schedule=None)
        assert not d.due and d.next_time == at(2026, 12, 1, 3, 0)

    def test_due_at_the_run(self) -> None:
        d = cron.decide("0 3 * * *", now=at(2026, 12, 1, 3, 0, 5), created=self.created, last_schedule=None)
        assert d.due and d.scheduled_for == at(2026, 12, 1, 3, 0) and d.next_time == at(2026, 12, 2, 3, 0)

    def test_not_due_twice_for_one_run(self) -> None:
        d = cron.decide(
            "0 3 * * *", now=at(2026, 12, 1, 3, 1), created=self.created, last_schedule=at(2026, 12, 1, 3, 0)
        )
        assert not d.due and d.next_time == at(2026, 12, 2, 3, 0)

    def test_missed_runs_collapse_into_the_latest(self) -> None:
        d = cron.decide(
            "0 * * * *",
            now=at(2026, 12, 3, 10, 30),
            created=self.created,
            last_schedule=at(2026, 12, 1, 3, 0),
        )
        assert d.due and d.scheduled_for == at(2026, 12, 3, 10, 0)

    def test_a_year_of_missed_minutes_is_cheap(self) -> None:
        d = cron.decide(
            "* * * * *",
            now=at(2027, 12, 1, 0, 0, 30),
            created=self.created,
            last_schedule=at(2026, 12, 1, 1, 0),
        )
        assert d.due and d.scheduled_for == at(2027, 12, 1, 0, 0)

    def test_immediate_runs_once_at_creation(self) -> None:
        now = at(2026, 12, 1, 1, 0, 2)
        d = cron.decide("0 3 * * *", now=now, created=self.created, last_schedule=None, immediate=True)
        assert d.due and d.scheduled_for == now
        d = cron.decide("0 3 * * *", now=now, created=self.created, last_schedule=now, immediate=True)
        assert not d.due

    def test_suspend_takes_nothing(self) -> None:
        d = cron.decide(
            "0 3 * * *",
            now=at(2026, 12, 5),
            created=self.created,
            last_schedule=None,
            suspend=True,
            immediate=True,
        )
        assert not d.due and d.scheduled_for is None
