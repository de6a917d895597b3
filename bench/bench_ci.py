#!/usr/bin/env python3
"""What CI lives through: `.ci/run` (exactly the README's `make test`) from a fresh clone, timed.

    python3 bench/bench_ci.py [--ref HEAD] [--cold] [--log /tmp/ci.log]

`--cold` gives the run empty caches of its own: the binary and image cache (PGOP_CACHE), Go's module
and build caches (GOMODCACHE, GOCACHE), pip's, and the test harness's runtime directories, in a
temporary directory removed afterwards; without it the run uses the machine's caches as CI does.
Prints one JSON line: the total, the binary builds, the test session, pass and fail counts, the slowest
modules as the suite reports them, and the load average before and after. The run uses the default
local-cluster state directory: nothing else may use it meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
_BUILT = re.compile(r"^(\S+) (\S+): built in (\d+) s$")
_SESSION = re.compile(r"^=*\s*(?:(\d+) failed, )?(\d+) passed.* in ([\d.]+)s")
# tests/suite.py's verdict over its two pytest sessions, when the log has one.
_SUITE = re.compile(r"^suite: (\d+) passed, (\d+) failed in ([\d.]+) s$")
_SLOW = re.compile(r"^\s+([\d.]+) s\s+(\d+) tests\s+(\S+)$")


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def summarize(log: str) -> dict[str, object]:
    """The figures a `.ci/run` log holds (pure: unit-testable on a saved log). The verdict is
    tests/suite.py's `suite:` line when there is one (two pytest sessions), else pytest's own."""
    lines = log.splitlines()
    built = {m[1]: int(m[3]) for m in map(_BUILT.match, lines) if m}
    passed, failed, seconds = 0, None, None
    for line in lines:
        m = _SESSION.search(line)
        if m:
            passed, failed, seconds = int(m[2]), int(m[1] or 0), float(m[3])
    suite = next((m for m in map(_SUITE.match, reversed(lines)) if m), None)
    if suite is not None:
        passed, failed, seconds = int(suite[1]), int(suite[2]), float(suite[3])
    # Every session's report of its slowest modules, merged.
    slowest: list[dict[str, object]] = []
    for i, line in enumerate(lines):
        if re.search(r"slowest \d+ modules", line):
            for row in lines[i + 1 : i + 11]:
                m = _SLOW.match(row)
                if not m:
                    break
                slowest.append({"module": m[3], "seconds": float(m[1]), "tests": int(m[2])})
    slowest.sort(key=lambda row: -float(str(row["seconds"])))
    return {
        "binaries_s": built,
        "pytest_s": seconds,
        "passed": passed,
        "failed": failed,
        "slowest_modules": slowest[:10],
    }


def _run_whole(argv: list[str], cwd: Path, env: dict[str, str], out: IO[str]) -> int:
    """Run `.ci/run` in a process group of its own, and take the whole group down if this bench is
    stopped: a test session left behind keeps polling the shared local cluster and, at its end, takes
    down whatever cluster then runs in that state directory (the next run's)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", default="HEAD", help="commit to clone and run")
    parser.add_argument("--cold", action="store_true", help="empty caches of its own")
    parser.add_argument("--log", type=Path, default=Path("/tmp/bench-ci.log"), help=".ci/run's output")
    args = parser.parse_args()

    ref = subprocess.run(["git", "-C", str(REPO), "rev-parse", args.ref], capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="bench-ci-"))
    # mkdtemp makes it 0700; the instance tests run Patroni as another user from the clone's src/.
    work.chmod(0o755)
    clone = work / "clone"
    env = dict(os.environ, CI="true")
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "-q", ref], check=True)
        if args.cold:
            caches = work / "caches"
            env.update(
                PGOP_CACHE=str(caches / "pg-operator"),
                GOMODCACHE=str(caches / "gomod"),
                GOCACHE=str(caches / "gobuild"),
                PIP_CACHE_DIR=str(caches / "pip"),
                # The instance and barman tests' unpacked PostgreSQL and venvs (tests/harness).
                PGOP_IT_RUNTIME=str(caches / "instance-it"),
                PGOP_BACKUP_RUNTIME=str(caches / "backup-it"),
            )
        load_before = _load()
        started = time.monotonic()
        with args.log.open("w") as out:
            rc = _run_whole(["bash", ".ci/run"], clone, env, out)
        total = time.monotonic() - started
        result = {
            "bench": "ci",
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "ref": ref[:12],
            "cold": args.cold,
            "rc": rc,
            "total_s": round(total, 1),
            **summarize(args.log.read_text(errors="replace")),
            "load_before": load_before,
            "load_after": _load(),
            "log": str(args.log),
        }
    finally:
        # Go's module cache is read-only on disk; make it removable first.
        subprocess.run(["chmod", "-R", "u+w", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
