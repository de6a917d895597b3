"""tests/suite.py and bench/bench_ci.py read verdicts from pytest's summary lines: both sessions' counts
add up, errors count as failures, and the CI bench takes the suite's own line over a session's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


suite = load("tests/suite.py", "suite_runner")
bench_ci = load("bench/bench_ci.py", "bench_ci_module")


def test_the_last_summary_line_counts_and_errors_are_failures() -> None:
    log = "\n".join(
        [
            "== 3 passed in 1.00s ==",
            "...",
            "===== 2 failed, 100 passed, 1 skipped, 1 error in 2500.20s (0:41:40) =====",
        ]
    )
    assert suite.tally(log) == (100, 3)
    assert suite.tally("====== 206 passed, 2 deselected in 1005.31s (0:16:45) ======") == (206, 0)
    assert suite.tally("no summary: pytest died") == (0, 0)


def test_the_integration_session_runs_in_a_private_namespace_without_the_network_tests() -> None:
    cmd = suite.integration_command("/venv/bin/python", ["-x"])
    assert cmd[:4] == ["unshare", "--net", "--mount", "hack/private-netns.sh"]
    script = cmd[-1]
    assert "tests/integration --ignore=tests/integration/test_image_build.py '-x'" in script
    assert script.endswith("localkube/cluster.py down >/dev/null 2>&1; exit $rc")
    host = suite.host_command("/venv/bin/python", [])
    assert host[3:] == ["tests/unit", "tests/integration/test_image_build.py", "tests/e2e"]


def test_the_ci_bench_prefers_the_suites_verdict_and_merges_the_slowest_modules() -> None:
    log = "\n".join(
        [
            "kubernetes v1.36.3: built in 448 s",
            "=== slowest 10 modules ===",
            "   300.0 s    12 tests  tests/e2e/test_backup.py",
            "=== 1 failed, 1500 passed in 1700.00s ===",
            "=== slowest 1 modules (set-up + call + teardown) ===",
            "   500.0 s    10 tests  tests/integration/test_backup_controller.py",
            "=== 206 passed in 1005.00s ===",
            "suite: 1706 passed, 1 failed in 1750.5 s",
        ]
    )
    figures = bench_ci.summarize(log)
    assert (figures["passed"], figures["failed"], figures["pytest_s"]) == (1706, 1, 1750.5)
    assert [row["module"] for row in figures["slowest_modules"]] == [
        "tests/integration/test_backup_controller.py",
        "tests/e2e/test_backup.py",
    ]
    assert figures["binaries_s"] == {"kubernetes": 448}
