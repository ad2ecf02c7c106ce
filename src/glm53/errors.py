"""The one exception type the command line turns into a single-line message and an exit code.

Every failure a person can cause or fix (bad flags, malformed logs, unreachable servers) is raised as a `Glm53Error`
carrying a sentence that says what was expected, what was found and what to do. The CLI prints that sentence and exits
with `exit_code`; nothing else reaches the user as a traceback. The argparse value types below belong here because
they are how a flag's value becomes such a sentence before any command runs.
"""

from __future__ import annotations

import argparse
import math

# Exit codes shared by every subcommand. Specific commands (the probe, validate, kind-smoke) add their own above 2.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class Glm53Error(Exception):
    """A failure with a one-line explanation for a person, and the exit code that goes with it."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())  # always one line, whatever the caller built
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


def positive_float(text: str) -> float:
    """An argparse type: a finite number above zero (`nan`, `inf` and `0` are refused with the value named)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of zero or more (`nan`, `inf` and negatives are refused, value named)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a finite number of zero or more, got {text!r}")
    return value
