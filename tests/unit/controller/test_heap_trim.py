"""The heap trimmer: glibc's malloc_trim found and called; memory freed in the heap's middle given back."""

from __future__ import annotations

import asyncio

from pg_operator.controller.heap_trim import Trimmer


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_trim_gives_back_pages_freed_below_live_blocks() -> None:
    trimmer = Trimmer()
    assert trimmer.available  # the test machine and the operator image use glibc
    # 40 MiB of 4 KiB blocks (malloc'd by CPython: over 512 bytes), touched; then every block but one in
    # 64 freed. The survivors pin the heap's top, so only malloc_trim can return the pages between them.
    blocks = [bytearray(b"x" * 4000) for _ in range(10_000)]
    keep = blocks[::64]
    del blocks
    before = _rss_kib()
    assert trimmer.trim()
    after = _rss_kib()
    assert before - after > 20 * 1024, (before, after)
    assert len(keep) == 157  # alive until here


async def test_run_returns_at_once_without_malloc_trim() -> None:
    trimmer = Trimmer()
    trimmer._trim = None
    assert not trimmer.available
    await asyncio.wait_for(trimmer.run(interval=0.01), timeout=1)


async def test_run_trims_on_its_interval() -> None:
    calls: list[int] = []
    trimmer = Trimmer()

    def counting(pad: int) -> int:
        calls.append(pad)
        return 0

    trimmer._trim = counting
    task = asyncio.create_task(trimmer.run(interval=0.01))
    await asyncio.sleep(0.1)
    task.cancel()
    assert len(calls) >= 3 and set(calls) == {0}
