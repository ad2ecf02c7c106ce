"""What `glm53 pod` and `glm53 fleet` share around their run: a work directory and SIGTERM treated as Ctrl-C.

Both start real server processes and must stop them however the command ends, so SIGTERM raises the same
KeyboardInterrupt as Ctrl-C and the orchestration's `finally` blocks run. The work directory (logs, the validation
report) is removed only after a passing run in a temporary directory the user did not ask to keep; otherwise its path
is printed, because the logs are what explains a failure.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType


@dataclass
class Session:
    """The run's work directory, and whether the run passed (set by the command before it returns)."""

    workdir: Path
    passed: bool = False


def add_session_arguments(parser: argparse.ArgumentParser, workdir_help: str) -> None:
    """`--workdir` and `--keep`, the two options `session` honours, and `--chart`, the pod's definition."""
    parser.add_argument("--chart", type=Path, help="the glm53 chart whose mock pod runs (default: this checkout's)")
    parser.add_argument("--workdir", type=Path, help=workdir_help)
    parser.add_argument("--keep", action="store_true", help="keep the temporary work dir even when validation passes")


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def session(name: str, workdir: Path | None, keep: bool) -> Iterator[Session]:
    """A `Session` in `workdir` (a new temporary one when None), with SIGTERM raising KeyboardInterrupt inside."""
    run = Session(workdir or Path(tempfile.mkdtemp(prefix=f"glm53-{name}-")))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield run
    finally:
        signal.signal(signal.SIGTERM, previous)
        if run.passed and workdir is None and not keep:
            shutil.rmtree(run.workdir, ignore_errors=True)
        else:
            print(f"{name}: logs and report kept in {run.workdir}", file=sys.stderr)
