"""Polling with a deadline: the one `wait_until` of tests and benchmarks."""

from __future__ import annotations

import subprocess
import time
import urllib.error
from collections.abc import Callable
from typing import Any

import httpx2
import psycopg

# What a check may raise while the thing it waits for is not there yet: a refused connection, a
# database still starting, a kubectl that failed, an object or key not yet present, an assertion, a
# field still None (TypeError on indexing it), an API server that lightkube could not reach or that
# refused a request (httpx2.HTTPError, ApiError's base). Anything else is a bug in the check: it fails
# at once.
NOT_YET: tuple[type[BaseException], ...] = (
    OSError, psycopg.Error, urllib.error.URLError, subprocess.SubprocessError, httpx2.HTTPError,
    AssertionError, LookupError, ValueError, TypeError,
)  # fmt: skip


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60, interval: float = 0.5) -> Any:
    """Poll check() until it returns something truthy and return that; NOT_YET errors mean "not yet".

    The timeout message names what was awaited and the last error or value seen.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except NOT_YET as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
