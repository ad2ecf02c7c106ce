"""Run a command in a process session of its own, and kill that whole session when the call ends, however it ends.

Why a session: a build's pip, ninja and nvcc outlived the `bash` that `subprocess.run` kills on a timeout and compiled
on for the rest of a CI run on its two cores; a CLI under fuzzing may leave a server behind. Killing the group after a
normal exit too takes whatever a command left running with it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from glm53.testing.processes import kill_group


@dataclass(frozen=True)
class Run:
    """A finished subprocess; `stdout` is empty when it was not captured."""

    returncode: int
    stdout: str
    stderr: str


def run_in_session(
    argv: Sequence[str | Path],
    *,
    timeout: float,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    capture_stdout: bool = True,
) -> Run:
    """Run `argv` from `cwd`, stdin closed, capturing its output (stdout unless told not to: a server's chatter);
    `subprocess.TimeoutExpired` after `timeout` seconds, its session killed first."""
    process = subprocess.Popen(
        [str(arg) for arg in argv],
        cwd=cwd,
        stdout=subprocess.PIPE if capture_stdout else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=None if env is None else dict(env),
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:  # the timeout, pytest-timeout's, Ctrl-C, or a normal exit: nothing of the run survives it
        kill_group(process)
        process.communicate()
    return Run(
        process.returncode,
        (stdout or b"").decode("utf-8", "backslashreplace"),
        stderr.decode("utf-8", "backslashreplace"),
    )
