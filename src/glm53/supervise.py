"""Run one server as a child process, copy its output to our stdout and to a size-capped log file, relay signals.

This is the container entrypoint of both images. Kubernetes reads container stdout, while the startup probe and the
exporter tail a file on the shared log volume; the file must stay bounded on a long-running pod, so it is rotated to
`FILE.1` (one generation, replacing the previous one) before it would exceed the cap. A rotated file is a new inode
that starts small, which is what the probe's tailing logic expects. SIGTERM/SIGINT go to the child so the server can
shut down cleanly, and our exit status is the child's (128 + signal number when a signal killed it, like a shell).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from glm53.errors import Glm53Error

MIB = 1024 * 1024
# Shell conventions for a command that could not be started.
EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RotatingLog:
    """An append-only log file that is renamed to `<path>.1` before a write would push it past `max_bytes`."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._file = self._open()

    def _open(self) -> BinaryIO:
        return open(self.path, "ab")

    def write(self, data: bytes) -> None:
        size = self._file.tell()
        if size > 0 and size + len(data) > self.max_bytes:
            self._file.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._file = self._open()
        self._file.write(data)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def start_child(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start `command` with stdout and stderr merged into one pipe, or fail the way a shell would."""
    try:
        return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError:
        raise Glm53Error(f"command not found: {command[0]}", EXIT_NOT_FOUND) from None
    except PermissionError:
        raise Glm53Error(f"permission denied: {command[0]} is not executable", EXIT_NOT_EXECUTABLE) from None


def exit_status(returncode: int) -> int:
    """A child's exit status as a shell reports it: negative Popen codes (killed by signal N) become 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _copy_output(child: subprocess.Popen[bytes], log: RotatingLog, echo: BinaryIO | None) -> None:
    assert child.stdout is not None
    for line in iter(child.stdout.readline, b""):
        log.write(line)
        if echo is not None:
            try:
                echo.write(line)
                echo.flush()
            except BrokenPipeError:
                echo = None  # nobody reads our stdout any more; the log file still gets everything


def supervise(command: Sequence[str], log_path: Path, max_log_bytes: int) -> int:
    """Run `command` until it exits, teeing its output; returns the exit status to use for ourselves."""
    if not command:
        raise Glm53Error("no command given; put the server command after `--`, e.g. -- glm53 mock lmcache ...")
    try:
        log = RotatingLog(log_path, max_log_bytes)
    except OSError as error:
        raise Glm53Error(f"cannot open log file {log_path}: {error.strerror}; check the directory exists") from None
    children: list[subprocess.Popen[bytes]] = []
    pending: list[int] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        # A signal that arrives while the child is still being started is delivered right after it starts.
        if not children:
            pending.append(signum)
        elif children[0].poll() is None:
            children[0].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        child = start_child(command)
        children.append(child)
        for signum in pending:
            child.send_signal(signum)
        _copy_output(child, log, sys.stdout.buffer)
        return exit_status(child.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.close()
