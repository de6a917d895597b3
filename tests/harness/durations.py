"""A pytest plugin: at the end of a run, the slowest test modules (set-up + call + teardown of every
test in the module, module- and session-scoped fixtures counted where pytest runs them), top 10, one
line each. What a CI budget is spent on, by module rather than by test."""

from __future__ import annotations

from collections import defaultdict

import pytest

TOP = 10


class ModuleDurations:
    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.tests: defaultdict[str, int] = defaultdict(int)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        if report.when == "call":
            self.tests[module] += 1

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        slowest = sorted(self.seconds.items(), key=lambda kv: kv[1], reverse=True)[:TOP]
        terminalreporter.write_sep("=", f"slowest {len(slowest)} modules (set-up + call + teardown)")
        for module, seconds in slowest:
            terminalreporter.write_line(f"{seconds:9.2f} s  {self.tests[module]:4d} tests  {module}")
