"""`glm53 supervise --log FILE [--max-log-mb N] [--hold-after-restart S] [--l2-dir DIR --l2-max-bytes N]
[--wait-for-resp HOST:PORT] -- CMD ARGS...`: the container entrypoint."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from glm53.commands.argtypes import host_port, non_negative_seconds, positive_float, positive_int
from glm53.commands.parser import command_parser
from glm53.errors import Glm53Error
from glm53.l2gate import RespEndpoint
from glm53.l2janitor import Bound
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
    parser.add_argument(
        "--l2-dir",
        type=Path,
        metavar="DIR",
        help="LMCache's filesystem L2 directory (the fs adapter's base_path): keep it under --l2-max-bytes by "
        "deleting its oldest chunk files every second, from before the server starts (needs --l2-max-bytes)",
    )
    parser.add_argument(
        "--l2-max-bytes",
        type=positive_int,
        metavar="N",
        help="the bound for --l2-dir, in bytes: past it, the oldest chunk files go until it holds 90 %% of it",
    )
    parser.add_argument(
        "--wait-for-resp",
        type=host_port,
        metavar="HOST:PORT",
        help="LMCache's shared L2 tier: start the server only once this Redis answers AUTH (LMCACHE_RESP_USERNAME, "
        "LMCACHE_RESP_PASSWORD) and PING",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return parser


def l2_bound(parser: argparse.ArgumentParser, directory: Path | None, max_bytes: int | None) -> Bound | None:
    """The L2 directory to keep bounded, or None; a usage error unless both flags or neither are given."""
    if directory is None and max_bytes is None:
        return None
    if directory is None or max_bytes is None:
        given, missing = ("--l2-dir", "--l2-max-bytes") if max_bytes is None else ("--l2-max-bytes", "--l2-dir")
        parser.error(f"{given} needs {missing}: give both to bound the L2 directory, or neither")
    if directory.exists() and not directory.is_dir():
        raise Glm53Error(f"--l2-dir {directory} is not a directory; give the fs L2 adapter's base_path")
    return Bound(directory, max_bytes)


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    # A cap beyond what a file offset can hold means "never rotate"; clamp it instead of overflowing.
    max_log_bytes = max(1, int(min(args.max_log_mb * MIB, sys.maxsize)))
    bound = l2_bound(parser, args.l2_dir, args.l2_max_bytes)
    tier = None if args.wait_for_resp is None else RespEndpoint(*args.wait_for_resp)
    return supervise(command, args.log, max_log_bytes, args.hold_after_restart, bound, tier)
