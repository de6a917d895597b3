"""Long commands (base backups) run detached inside an instance pod, watched with short execs.

A base backup takes minutes; the operator does not hold a connection or a worker for it. It starts the
command in a new session (setsid), writing its output and, when it ends, its exit status to files on the
data volume next to PGDATA. Later reconciles read those files. The files survive an operator restart (it
resumes watching) and a container restart (the process is gone, there is no exit file: the job is
reported lost rather than waited for forever). Starting is idempotent: a job whose pid file exists is
not started a second time.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

JOB_DIR = "/var/lib/postgresql/data/backups"
MAX_OUTPUT = 4000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")

JobPhase = Literal["absent", "running", "exited", "lost"]


@dataclass(frozen=True)
class JobState:
    phase: JobPhase
    exit_status: int | None = None
    output: str = ""  # the tail of the command's combined stdout/stderr


def _check(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"job name {name!r} must be letters, digits, '.', '_', '-'")
    return name


def _vars(name: str, job_dir: str) -> str:
    return f"D={shlex.quote(job_dir)}; N={shlex.quote(_check(name))}; "


# A new major's first base backup starts on the primary as soon as it is labelled so, which can be before
# its promotion ended; PostgreSQL refuses pg_backup_start in recovery once it replayed WAL written with
# full_page_writes=off (pg_upgrade writes such WAL; CI's upgrade e2e met it). Such a job first waits, at
# most this long, for the instance to leave recovery.
WRITABLE_WAIT_SECONDS = 120


def once_writable(
    argv: Sequence[str], psql: Sequence[str], seconds: int = WRITABLE_WAIT_SECONDS
) -> list[str]:
    """`argv` run once `psql` (the local superuser's) sees the instance out of recovery, or after `seconds`
    (then the command meets whatever holds, and fails with its own message)."""
    check = shlex.join([*psql, "-c", "SELECT pg_is_in_recovery()"])
    script = (f'i=0; while [ "$({check} 2>/dev/null)" != f ] && [ "$i" -lt {int(seconds)} ]; do '
              'i=$((i+1)); sleep 1; done; exec "$@"')  # fmt: skip
    return ["sh", "-c", script, "pgop-wait-writable", *argv]


def start_script(name: str, argv: Sequence[str], *, job_dir: str = JOB_DIR) -> str:
    """A `sh -c` script: start `argv` detached unless this job was started before; prints `started` or
    `already-started`. The exit status is written to a temporary file and renamed, so a reader never sees
    half of it."""
    command = shlex.join(argv)
    wrapper = f'{command} >"$D/$N.log" 2>&1; echo $? >"$D/$N.exit.tmp"; mv "$D/$N.exit.tmp" "$D/$N.exit"'
    return (
        _vars(name, job_dir)
        + 'mkdir -p "$D" && '
        + 'if [ -e "$D/$N.pid" ]; then echo already-started; exit 0; fi; '
        + "export D N; "
        # The job's name is the wrapper's $0, so its command line names it (see poll_script).
        + f'setsid sh -c {shlex.quote(wrapper)} "pgop-job-$N" </dev/null >/dev/null 2>&1 & '
        + 'echo $! >"$D/$N.pid"; echo started'
    )


def poll_script(name: str, *, job_dir: str = JOB_DIR) -> str:
    """A `sh -c` script printing the job's state on its first line (`exited <status>`, `running`,
    `lost`, `absent`), then the tail of its output. A pid counts as the job's only while that process's
    command line names the job (pids are reused after a container restart)."""
    return (
        _vars(name, job_dir)
        + 'if [ -f "$D/$N.exit" ]; then echo "exited $(cat "$D/$N.exit")"; '
        + f'tail -c {MAX_OUTPUT} "$D/$N.log" 2>/dev/null; '
        + 'elif [ -f "$D/$N.pid" ]; then P=$(cat "$D/$N.pid"); '
        + 'if [ -r "/proc/$P/cmdline" ] && tr "\\0" " " <"/proc/$P/cmdline" | grep -qF -- "pgop-job-$N"; '
        + "then echo running; "
        # The job may have ended between the first test and this one: it writes its exit file before
        # it exits, so only a process gone without one is lost.
        + 'elif [ -f "$D/$N.exit" ]; then echo "exited $(cat "$D/$N.exit")"; '
        + f'tail -c {MAX_OUTPUT} "$D/$N.log" 2>/dev/null; '
        + f'else echo lost; tail -c {MAX_OUTPUT} "$D/$N.log" 2>/dev/null; fi; '
        + "else echo absent; fi"
    )


def cleanup_script(name: str, *, job_dir: str = JOB_DIR) -> str:
    """Remove a finished job's files (its outcome is in the Backup's status by then)."""
    return _vars(name, job_dir) + 'rm -f "$D/$N.pid" "$D/$N.exit" "$D/$N.exit.tmp" "$D/$N.log"'


def parse_poll(stdout: str) -> JobState:
    first, _, rest = stdout.partition("\n")
    words = first.split()
    if not words:
        raise ValueError("job poll printed nothing")
    if words[0] == "exited":
        if len(words) != 2 or not words[1].lstrip("-").isdigit():
            # The exit file is written before the rename; an unreadable one is a bug, not a state.
            raise ValueError(f"job poll: unreadable exit status {first!r}")
        return JobState("exited", int(words[1]), rest[-MAX_OUTPUT:])
    if words[0] in ("running", "absent"):
        return JobState(words[0])  # type: ignore[arg-type]
    if words[0] == "lost":
        return JobState("lost", None, rest[-MAX_OUTPUT:])
    raise ValueError(f"job poll: unexpected first line {first!r}")
