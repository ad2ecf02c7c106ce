"""The progress display validation writes to stderr while it runs, so stdout carries only the report.

On a terminal one line is rewritten in place (`\r`); in a log or a pipe every step is its own line, which keeps CI logs
readable and lets a test wait for a step by reading lines.
"""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """Reports the current step; `done()` ends an in-place line so the next output starts on a fresh one."""

    def __init__(self, stream: TextIO | None = None, in_place: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.in_place = self.stream.isatty() if in_place is None else in_place
        self._width = 0

    def step(self, message: str) -> None:
        if self.in_place:
            self.stream.write("\r" + message.ljust(self._width))
            self._width = len(message)
        else:
            self.stream.write(message + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.in_place and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


class SilentProgress(Progress):
    """No display at all (library use, tests)."""

    def step(self, message: str) -> None:
        pass

    def done(self) -> None:
        pass
