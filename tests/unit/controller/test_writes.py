"""`all_of`: a pass's independent writes run together, every one ends, the first failure is raised."""

from __future__ import annotations

import asyncio

import pytest

from pg_operator.controller.writes import all_of


def test_counts_the_writes_made() -> None:
    async def write(n: int) -> int:
        await asyncio.sleep(0)
        return n

    assert asyncio.run(all_of([write(1), write(0), write(1)])) == 2
    assert asyncio.run(all_of([])) == 0


def test_they_run_together() -> None:
    async def scenario() -> int:
        started: list[int] = []
        gate = asyncio.Event()

        async def write(i: int) -> int:
            started.append(i)
            if len(started) == 3:
                gate.set()
            await asyncio.wait_for(gate.wait(), timeout=1)  # deadlocks if they ran one after another
            return 1

        return await all_of([write(i) for i in range(3)])

    assert asyncio.run(scenario()) == 3


def test_every_write_ends_before_the_first_failure_is_raised() -> None:
    finished: list[str] = []

    async def fails_fast() -> int:
        raise LookupError("refused")

    async def slow() -> int:
        await asyncio.sleep(0.05)
        finished.append("slow")
        return 1

    async def fails_late() -> int:
        await asyncio.sleep(0.01)
        raise ValueError("later")

    with pytest.raises(LookupError, match="refused"):
        asyncio.run(all_of([slow(), fails_fast(), fails_late()]))
    assert finished == ["slow"]
