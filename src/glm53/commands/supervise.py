"""`glm53 supervise --log FILE [--max-log-mb N] [--hold-after-restart S] -- CMD ARGS...`: the container entrypoint."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from glm53.commands.argtypes import non_negative_seconds, positive_float
from glm53.commands.parser import command_parser
from glm53.supervise import MIB, supervise

DEFAULT_MAX_LOG_MB = 100.0


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "supervise",
        "Run a server, copy its stdout+stderr to our stdout and to a rotated log file, forward "
        "TERM/INT/HUP/QUIT/USR1/USR2, reap orphaned processes, and exit with the server's status as soon as it exits.",
    )
    parser.add_argument("--log", required=True, type=Path, help="log file to append to (rotated to FILE.1)")
    parser.add_argument(
        "--max-log-mb",
        type=positive_float,
        default=DEFAULT_MAX_LOG_MB,
        help="rotate before the log exceeds this many MiB (fractions allowed; default %(default)g)",
    )
    parser.add_argument(
        "--hold-after-restart",
        type=non_negative_seconds("0: never"),
        default=0.0,
        metavar="SECONDS",
        help="when this container starts again in the same pod (counted next to --log), wait this long before the "
        "server starts (default 0: never)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    # A cap beyond what a file offset can hold means "never rotate"; clamp it instead of overflowing.
    max_log_bytes = max(1, int(min(args.max_log_mb * MIB, sys.maxsize)))
    return supervise(command, args.log, max_log_bytes, args.hold_after_restart)
