"""When a cron schedule (`pg_operator.api.schedule`, its grammar) fires, evaluated in UTC, and whether a
ScheduledBackup is due.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pg_operator.api.schedule import Schedule, parse

# How far ahead a schedule is searched; a valid one (e.g. "0 0 29 2 *") always fires within 8 years.
_HORIZON_DAYS = 366 * 8 + 2


def next_run(schedule: str | Schedule, after: dt.datetime) -> dt.datetime:
    """The first matching minute strictly after `after` (an aware datetime), in UTC."""
    if after.tzinfo is None:
        raise ValueError("next_run: `after` must be timezone-aware")
    sched = parse(schedule) if isinstance(schedule, str) else schedule
    start = after.astimezone(dt.UTC).replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    day = start.date()
    hours = sorted(sched.hours)
    minutes = sorted(sched.minutes)
    for _ in range(_HORIZON_DAYS):
        if sched.matches_day(day):
            for hour in hours:
                for minute in minutes:
                    candidate = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=dt.UTC)
                    if candidate >= start:
                        return candidate
        day += dt.timedelta(days=1)
    raise ValueError(f"schedule: {schedule!r} never fires")


def last_run(schedule: str | Schedule, at_or_before: dt.datetime) -> dt.datetime:
    """The latest matching minute at or before `at_or_before` (aware), in UTC."""
    if at_or_before.tzinfo is None:
        raise ValueError("last_run: `at_or_before` must be timezone-aware")
    sched = parse(schedule) if isinstance(schedule, str) else schedule
    end = at_or_before.astimezone(dt.UTC).replace(second=0, microsecond=0)
    day = end.date()
    hours = sorted(sched.hours, reverse=True)
    minutes = sorted(sched.minutes, reverse=True)
    for _ in range(_HORIZON_DAYS):
        if sched.matches_day(day):
            for hour in hours:
                for minute in minutes:
                    candidate = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=dt.UTC)
                    if candidate <= end:
                        return candidate
        day -= dt.timedelta(days=1)
    raise ValueError(f"schedule: {schedule!r} never fires")


@dataclass(frozen=True)
class ScheduleDecision:
    due: bool  # create a Backup now
    scheduled_for: dt.datetime | None  # the run it stands for (lastScheduleTime), when due
    next_time: dt.datetime  # when to look again


def decide(
    schedule: str,
    *,
    now: dt.datetime,
    created: dt.datetime,
    last_schedule: dt.datetime | None,
    suspend: bool = False,
    immediate: bool = False,
) -> ScheduleDecision:
    """Whether a ScheduledBackup should start a Backup now.

    At most one Backup per pass: runs missed while the operator was down collapse into one (the latest),
    as a backup taken now covers them all. `immediate` asks for one right after creation.
    """
    sched = parse(schedule)
    if suspend:
        return ScheduleDecision(False, None, next_run(sched, now))
    if last_schedule is None and immediate:
        return ScheduleDecision(True, now, next_run(sched, now))
    reference = last_schedule or created
    first_due = next_run(sched, reference)
    if first_due > now:
        return ScheduleDecision(False, None, first_due)
    return ScheduleDecision(True, last_run(sched, now), next_run(sched, now))
