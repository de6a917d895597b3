"""The grammar of a ScheduledBackup's schedule: five-field cron (minute hour day-of-month month
day-of-week), in UTC.

Numbers only (no month or weekday names): `*`, `a`, `a-b`, with an optional `/step`, comma-separated.
Day-of-week 0 and 7 are Sunday. As in Vixie cron, when both day-of-month and day-of-week are restricted a
day matches if either does. The same grammar is the CRD's rule (`SCHEDULE_PATTERN`), so the API server
refuses what `parse` would. When a schedule fires is `pg_operator.backup.cron`'s business.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

# Per field: (name, lowest, highest, regex of one number in range). The regexes avoid backslashes: they are
# also used inside CEL rules.
_FIELDS: tuple[tuple[str, int, int, str], ...] = (
    ("minute", 0, 59, "([0-5]?[0-9])"),
    ("hour", 0, 23, "([01]?[0-9]|2[0-3])"),
    ("day of month", 1, 31, "(0?[1-9]|[12][0-9]|3[01])"),
    ("month", 1, 12, "(0?[1-9]|1[0-2])"),
    ("day of week", 0, 7, "([0-7])"),
)
MACROS: dict[str, str] = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


def _field_pattern(number: str) -> str:
    item = f"([*]|{number}(-{number})?)(/[1-9][0-9]?)?"
    return f"{item}(,{item})*"


SCHEDULE_PATTERN = "^(" + "[ ]+".join(_field_pattern(f[3]) for f in _FIELDS) + "|" + "|".join(MACROS) + ")$"
MAX_SCHEDULE_LENGTH = 128


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday … 6 = Saturday
    days_restricted: bool
    weekdays_restricted: bool

    def matches_day(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        dom = day.day in self.days
        dow = (day.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return dom or dow
        return dom and dow


def _parse_field(text: str, name: str, low: int, high: int) -> tuple[frozenset[int], bool]:
    values: set[int] = set()
    for item in text.split(","):
        base, _, step_text = item.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"schedule: {name} step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        else:
            first, dash, last = base.partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise ValueError(f"schedule: {name} {item!r} is not a number, range or '*'")
            start = int(first)
            end = int(last) if dash else (high if step_text else start)
            if start < low or end > high:
                raise ValueError(f"schedule: {name} {item!r} is outside {low}-{high}")
            if start > end:
                raise ValueError(f"schedule: {name} range {base!r} runs backwards")
        values.update(range(start, end + 1, step))
    return frozenset(values), text != "*"


def parse(schedule: str) -> Schedule:
    """The schedule's sets of matching values; ValueError naming the field at fault."""
    text = MACROS.get(schedule.strip(), schedule.strip())
    parts = text.split()
    if len(parts) != 5:
        raise ValueError(
            f"schedule: {schedule!r} must have 5 fields (minute hour day-of-month month day-of-week) "
            f"or be one of {', '.join(MACROS)}"
        )
    parsed = [
        _parse_field(p, name, low, high) for p, (name, low, high, _) in zip(parts, _FIELDS, strict=True)
    ]
    weekdays = frozenset(d % 7 for d in parsed[4][0])
    sched = Schedule(
        minutes=parsed[0][0],
        hours=parsed[1][0],
        days=parsed[2][0],
        months=parsed[3][0],
        weekdays=weekdays,
        days_restricted=parsed[2][1],
        weekdays_restricted=parsed[4][1],
    )
    if not any(_day_can_exist(sched, m) for m in sched.months) and not sched.weekdays_restricted:
        raise ValueError(f"schedule: {schedule!r} names a day that no month in it has")
    return sched


def _day_can_exist(sched: Schedule, month: int) -> bool:
    longest = 29 if month == 2 else (30 if month in (4, 6, 9, 11) else 31)
    return any(d <= longest for d in sched.days)
