"""Argument types shared by the operator's command and `kubectl pgc`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

UNITS = {"s": 1, "m": 60, "h": 3600}


def duration_between(low: float, high: float | None = None) -> Callable[[str], float]:
    """An argparse type: seconds, or a number with s, m or h (as kubectl's --timeout and --since), with
    `low` < value (`low` = 0) or `low` <= value, and value <= `high` when given."""

    def duration(value: str) -> float:
        text = value.strip()
        number, scale = (text[:-1], UNITS[text[-1]]) if text[-1:] in UNITS else (text, 1)
        try:
            seconds = float(number) * scale
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a duration (e.g. 90, 90s, 10m, 1h): {value}") from None
        if seconds <= 0 or seconds < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g} s: {value}" if low else
                                             f"must be positive: {value}")  # fmt: skip
        if high is not None and seconds > high:
            raise argparse.ArgumentTypeError(f"duration out of range ({low:g} s to {high:g} s): {value}")
        return seconds

    return duration
