"""The one exception type the command line turns into a single-line message and an exit code.

Every failure a person can cause or fix (bad flags, malformed logs, unreachable servers) is raised as a `Glm53Error`
carrying a sentence that says what was expected, what was found and what to do. The CLI prints that sentence and exits
with `exit_code`; nothing else reaches the user as a traceback. The exit codes every subcommand shares are here too;
the argparse checks that refuse a bad flag value before any command runs are in `glm53.commands.argtypes`.
"""

from __future__ import annotations

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
