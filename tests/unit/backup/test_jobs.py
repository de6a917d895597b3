"""Detached jobs: the start/poll/cleanup scripts run by a real /bin/sh, as they run in the pod."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from pg_operator.backup.jobs import cleanup_script, parse_poll, poll_script, start_script


def sh(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10, check=True).stdout


def test_a_job_runs_detached_reports_its_exit_and_output_and_starts_once(tmp_path: Path) -> None:
    d = str(tmp_path / "backups")
    marker = tmp_path / "runs"
    argv = ["sh", "-c", f"echo run >>{marker}; echo out; sleep 1; echo err >&2; exit 3"]
    assert sh(start_script("b-1", argv, job_dir=d)).strip() == "started"
    assert sh(start_script("b-1", argv, job_dir=d)).strip() == "already-started"
    assert parse_poll(sh(poll_script("b-1", job_dir=d))).phase == "running"
    deadline = time.monotonic() + 10
    while (state := parse_poll(sh(poll_script("b-1", job_dir=d)))).phase == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert (state.phase, state.exit_status) == ("exited", 3)
    assert state.output.split() == ["out", "err"]
    assert marker.read_text() == "run\n"  # the second start did not run it again
    sh(cleanup_script("b-1", job_dir=d))
    assert parse_poll(sh(poll_script("b-1", job_dir=d))).phase == "absent"


def test_a_pid_that_is_not_the_job_means_lost(tmp_path: Path) -> None:
    d = tmp_path / "backups"
    d.mkdir()
    # A live process with another command line (the pid reused after a container restart).
    (d / "b-2.pid").write_text(f"{subprocess.Popen(['sleep', '5']).pid}\n")
    (d / "b-2.log").write_text("started\n")
    state = parse_poll(sh(poll_script("b-2", job_dir=str(d))))
    assert (state.phase, state.output) == ("lost", "started\n")


def test_names_are_checked_and_output_is_parsed_strictly() -> None:
    with pytest.raises(ValueError, match="job name"):
        start_script("a;rm -rf /", ["true"])
    with pytest.raises(ValueError, match="unexpected"):
        parse_poll("what\n")
    with pytest.raises(ValueError, match="exit status"):
        parse_poll("exited x\n")
