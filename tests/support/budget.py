"""The suite's budget report: where a run's wall time went, printed as the last lines of every pytest run.

Why: CI's time is the project's bottleneck (a 90-minute hard limit, a 30-minute target), and a figure nobody prints is
a figure nobody watches. `scripts/test.sh` times its own phases (set-up, lint) and hands them over in
`GLM53_BUDGET_PHASES` (`setup=312 lint=95`); this plugin adds pytest's own wall time and the slowest test phases
(a fixture's set-up is charged to the set-up phase of the first test that asks for it, as pytest's `--durations` does).
Under pytest-xdist the controller receives every worker's reports, so one report covers both workers.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

SLOWEST = 20
COSTLIEST_FILES = 8
PHASES_VARIABLE = "GLM53_BUDGET_PHASES"


@dataclass(frozen=True)
class Phase:
    """One timed phase of one test: its set-up (fixtures included), call or teardown."""

    seconds: float
    when: str
    nodeid: str
    worker: str  # the xdist worker that ran it (`gw0`), or `main` without workers

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


def parse_phases(text: str) -> list[tuple[str, float]]:
    """`setup=312 lint=95` as [("setup", 312.0), ("lint", 95.0)]; a malformed entry is a one-line error."""
    phases = []
    for entry in text.split():
        name, sep, value = entry.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not name or seconds < 0:
            raise pytest.UsageError(f"expected {PHASES_VARIABLE} entries like 'setup=312' but got {entry!r}")
        phases.append((name, seconds))
    return phases


def report_lines(phases: list[tuple[str, float]], pytest_s: float, timed: list[Phase]) -> list[str]:
    """The report's lines: the costliest test files, the slowest test phases, each worker's busy time, then the totals.

    Costliest last and totals at the very end, because a CI log is read from its tail: the lines a truncated view keeps.
    A worker's busy time beside pytest's wall time shows how well the files were spread over the workers.
    """
    by_file: dict[str, float] = {}
    by_worker: dict[str, float] = {}
    for phase in timed:
        by_file[phase.file] = by_file.get(phase.file, 0.0) + phase.seconds
        by_worker[phase.worker] = by_worker.get(phase.worker, 0.0) + phase.seconds
    files = sorted(by_file.items(), key=lambda item: item[1])[-COSTLIEST_FILES:]
    lines = [f"budget: the {len(files)} costliest test files (all their phases):"]
    lines += [f"{seconds:8.1f} s  {file}" for file, seconds in files]
    slowest = sorted(timed, key=lambda phase: phase.seconds)[-SLOWEST:]
    lines.append(f"budget: the {len(slowest)} slowest test phases (a fixture counts in its first user's setup):")
    lines += [f"{phase.seconds:8.1f} s  {phase.when:<8} {phase.nodeid}" for phase in slowest]
    busy = ", ".join(f"{worker} {seconds:.0f} s" for worker, seconds in sorted(by_worker.items()))
    lines.append(f"budget: busy per worker: {busy or 'none'}")
    totals = [*phases, ("pytest", pytest_s)]
    summary = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in totals)
    lines.append(f"budget: {summary}; {sum(s for _, s in totals):.0f} s in all")
    return lines


class BudgetReport:
    """Collects every test phase's duration and prints the report after the run."""

    def __init__(self, phases: list[tuple[str, float]]) -> None:
        self.phases = phases
        self.started = time.monotonic()
        self.timed: list[Phase] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        # Under xdist the controller receives the report with its worker attached (xdist/dsession.py:328).
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        self.timed.append(Phase(report.duration, report.when, report.nodeid, worker))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """After pytest's own last line (the short summary and the counts), so that the report ends the log."""
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            return
        terminal.section("budget")
        for line in report_lines(self.phases, time.monotonic() - self.started, self.timed):
            terminal.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    # Only the controller reports: an xdist worker (it has `workerinput`) would print its half.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(BudgetReport(parse_phases(os.environ.get(PHASES_VARIABLE, ""))), "glm53-budget")
