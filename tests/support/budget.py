"""The suite's budget report: where a run's wall time went, printed as the last lines of every pytest run.

Why: CI's time is the project's bottleneck (a 90-minute hard limit, a 30-minute target), and a figure nobody prints is
a figure nobody watches. `scripts/test.sh` times its own phases (set-up, lint) and hands them over in
`GLM53_BUDGET_PHASES` (`setup=312 lint=95`); this plugin adds pytest's own wall time and the slowest test phases
(a fixture's set-up is charged to the set-up phase of the first test that asks for it, as pytest's `--durations` does).
Under pytest-xdist the controller receives every worker's reports, so one report covers both workers.

Wall time alone misleads on a 2-core machine that the suite keeps busy: a test that waits costs the other worker
nothing, a test that computes slows it down. So each phase also carries the CPU seconds its process and its reaped
child processes used (`getrusage`; a server stopped in a later phase is charged there, and what the Docker engine's
containers use is the daemon's, not the test's), and the report ends with how busy the machine's cores were.

A failed run ends with one line per failed phase and what failed in it: CI shows only the head and the tail of a long
log, and a second failure's traceback falls in the cut between them.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Generator
from dataclasses import dataclass

import pytest
from pluggy import Result

SLOWEST = 20
COSTLIEST_FILES = 8
PHASES_VARIABLE = "GLM53_BUDGET_PHASES"
CPU_PROPERTY = "cpu_s"
PROC_STAT = "/proc/stat"
FAILURE_CHARS = 600  # of a failure's message, on its one line


@dataclass(frozen=True)
class Phase:
    """One timed phase of one test: its set-up (fixtures included), call or teardown."""

    seconds: float
    when: str
    nodeid: str
    worker: str  # the xdist worker that ran it (`gw0`), or `main` without workers
    cpu_s: float = 0.0  # CPU seconds of the worker and its reaped children during the phase

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


def report_lines(
    phases: list[tuple[str, float]], pytest_s: float, timed: list[Phase], busy_share: float | None = None
) -> list[str]:
    """The report's lines: the costliest test files, the slowest test phases, each worker's busy time, then the totals.

    Costliest last and totals at the very end, because a CI log is read from its tail: the lines a truncated view keeps.
    A worker's busy time beside pytest's wall time shows how well the files were spread over the workers; the CPU
    seconds beside each file's wall time, which files load the machine and which only wait.
    """
    by_file: dict[str, tuple[float, float]] = {}
    by_worker: dict[str, float] = {}
    for phase in timed:
        wall, cpu = by_file.get(phase.file, (0.0, 0.0))
        by_file[phase.file] = (wall + phase.seconds, cpu + phase.cpu_s)
        by_worker[phase.worker] = by_worker.get(phase.worker, 0.0) + phase.seconds
    files = sorted(by_file.items(), key=lambda item: item[1][0])[-COSTLIEST_FILES:]
    lines = [f"budget: the {len(files)} costliest test files (all their phases; wall, then CPU):"]
    lines += [f"{wall:8.1f} s  {cpu:7.1f} s cpu  {file}" for file, (wall, cpu) in files]
    slowest = sorted(timed, key=lambda phase: phase.seconds)[-SLOWEST:]
    lines.append(f"budget: the {len(slowest)} slowest test phases (a fixture counts in its first user's setup):")
    lines += [f"{phase.seconds:8.1f} s  {phase.when:<8} {phase.nodeid}" for phase in slowest]
    busy = ", ".join(f"{worker} {seconds:.0f} s" for worker, seconds in sorted(by_worker.items()))
    lines.append(f"budget: busy per worker: {busy or 'none'}")
    cpu_line = f"budget: CPU of the tests' processes {sum(phase.cpu_s for phase in timed):.0f} s"
    if busy_share is not None:
        cpu_line += f"; the machine's {os.cpu_count()} cores {busy_share:.0%} busy during pytest"
    lines.append(cpu_line)
    totals = [*phases, ("pytest", pytest_s)]
    summary = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in totals)
    lines.append(f"budget: {summary}; {sum(s for _, s in totals):.0f} s in all")
    return lines


def failure_line(report: pytest.TestReport) -> str:
    """One line for a failed test phase: its id and the start of what failed (pytest's crash message: the assertion
    and its explanation, or the exception), newlines folded."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = str(crash.message if crash is not None else report.longrepr)
    text = " | ".join(line.strip() for line in message.splitlines() if line.strip()) or "no message"
    if len(text) > FAILURE_CHARS:
        text = text[: FAILURE_CHARS - 3] + "..."
    return f"budget: failed: {report.nodeid} ({report.when}): {text}"


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children it has reaped (theirs include the children they reaped)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat's `cpu` line; None where there is none."""
    try:
        with open(PROC_STAT, encoding="ascii") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total  # idle and iowait are not busy


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the cores' time spent busy between two `machine_ticks` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class CpuMeter:
    """Charges each test phase the CPU seconds used since the previous phase ended, on whichever process runs it (an
    xdist worker, or pytest's own process without workers); the seconds travel in the report's `user_properties`,
    which xdist hands to the controller."""

    def __init__(self) -> None:
        self.mark = cpu_seconds()

    def pytest_runtest_logstart(self) -> None:
        self.mark = cpu_seconds()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self) -> Generator[None, Result[pytest.TestReport], None]:
        outcome = yield
        now = cpu_seconds()
        outcome.get_result().user_properties.append((CPU_PROPERTY, round(now - self.mark, 3)))
        self.mark = now


class BudgetReport:
    """Collects every test phase's duration and prints the report after the run."""

    def __init__(self, phases: list[tuple[str, float]]) -> None:
        self.phases = phases
        self.started = time.monotonic()
        self.ticks = machine_ticks()
        self.timed: list[Phase] = []
        self.failures: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failures.append(failure_line(report))
        # Under xdist the controller receives the report with its worker attached (xdist/dsession.py:328).
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else "main"
        cpu = sum(v for name, v in report.user_properties if name == CPU_PROPERTY and isinstance(v, float))
        self.timed.append(Phase(report.duration, report.when, report.nodeid, worker, cpu))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """After pytest's own last line (the short summary and the counts), so that the report ends the log."""
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is None:
            return
        terminal.section("budget")
        busy = busy_share(self.ticks, machine_ticks())
        for line in report_lines(self.phases, time.monotonic() - self.started, self.timed, busy) + self.failures:
            terminal.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuMeter(), "glm53-cpu-meter")
    # Only the controller reports: an xdist worker (it has `workerinput`) would print its half.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(BudgetReport(parse_phases(os.environ.get(PHASES_VARIABLE, ""))), "glm53-budget")
