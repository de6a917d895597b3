"""The one duration type of both commands: units, and each command's bounds."""

from __future__ import annotations

import argparse

import pytest

from pg_operator.cli.arguments import duration_between


def test_units_and_bounds() -> None:
    operator = duration_between(1, 7 * 86400)
    assert [operator(v) for v in ("90", "90s", "10m", "1h")] == [90.0, 90.0, 600.0, 3600.0]
    for bad in ("0.5", "8d", "200h", "soon", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            operator(bad)
    positive = duration_between(0)
    assert positive("0.5") == 0.5 and positive("1000h") == 3_600_000.0
    with pytest.raises(argparse.ArgumentTypeError, match="must be positive"):
        positive("0")
