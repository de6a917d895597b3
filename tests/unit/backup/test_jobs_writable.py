"""A job that must start on a writable instance waits for it to leave recovery, run by a real sh with a
stand-in psql (no PostgreSQL: the script's own logic is what is tested)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pg_operator.backup.jobs import once_writable


def stand_in_psql(tmp_path: Path, answers: list[str]) -> dict[str, str]:
    """`psql` answers the given lines in turn (the last one from then on), counting its calls."""
    (tmp_path / "answers").write_text("\n".join(answers) + "\n")
    script = tmp_path / "psql"
    script.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {tmp_path}/calls 2>/dev/null || echo 0); n=$((n+1)); echo $n > {tmp_path}/calls\n"
        f'line=$(sed -n "${{n}}p" {tmp_path}/answers)\n'
        f'[ -n "$line" ] || line=$(tail -n 1 {tmp_path}/answers)\n'
        'echo "$line"\n'
    )
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def test_the_command_runs_once_the_instance_left_recovery(tmp_path: Path) -> None:
    env = stand_in_psql(tmp_path, ["t", "t", "f"])
    argv = once_writable(["echo", "backup ran"], ["psql", "-AtX"], seconds=10)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "backup ran"
    assert (tmp_path / "calls").read_text().strip() == "3"  # asked until it answered f


def test_after_the_wait_the_command_runs_anyway_and_meets_what_holds(tmp_path: Path) -> None:
    env = stand_in_psql(tmp_path, ["t"])
    argv = once_writable(["sh", "-c", "echo still in recovery; exit 3"], ["psql"], seconds=2)
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 3 and out.stdout.strip() == "still in recovery"
    assert int((tmp_path / "calls").read_text()) == 3  # two waits of a second, then the last look
