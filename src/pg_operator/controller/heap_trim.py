"""Freed heap memory handed back to the system every few seconds (glibc's `malloc_trim`).

CPython passes every block over 512 bytes to the C library's malloc: each watch event's body, each
cached object's packed JSON (`cache.Packed`). The cached bodies stay for the life of the process and
are allocated in the middle of a burst of short-lived ones, so the pages freed around them are not at
the top of the heap, where glibc's own trimming looks; RSS keeps the burst's high-water mark.
`malloc_trim(0)` releases every wholly free page, wherever it lies. Where the C library has no
malloc_trim (musl), `Trimmer.available` is False and `run` returns at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class Trimmer:
    def __init__(self) -> None:
        self._trim = _malloc_trim()

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim(self) -> bool:
        """True when some memory was released."""
        return bool(self._trim(0)) if self._trim is not None else False

    async def run(self, interval: float = INTERVAL_SECONDS) -> None:
        if self._trim is None:
            log.info("no malloc_trim in this C library; freed heap memory is left to the allocator")
            return
        while True:
            await asyncio.sleep(interval)
            self.trim()
