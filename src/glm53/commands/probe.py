"""`glm53 probe startup`: the kubelet's startup probe, exit 0 only once the cache geometry is the one the model needs.

This is the I/O edge around `glm53.probe.judge`: it follows each log from where the previous invocation stopped (a small
state file per log keeps the position and the facts already learned), feeds the new lines to the parser and prints the
verdict as one line. It runs every few seconds for the whole model load, so it imports only the standard library and
glm53's own pure modules, and its cost depends on the bytes added since last time, not on the log's size.
With `--warm-up URL`, a right geometry is only Ready once the engine answered one request through its sidecar
(`glm53.probe.warmup`: it starts the connector's heartbeats, which LMCache starts lazily).
"""

from __future__ import annotations

import argparse
import binascii
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from glm53.chunks import parse_positive
from glm53.commands.argtypes import non_negative_seconds, positive_float
from glm53.commands.parser import command_parser
from glm53.errors import Glm53Error
from glm53.probe.judge import StartupFacts, Status, Verdict, evaluate
from glm53.probe.logparse import parse_lines
from glm53.probe.logtail import LogFollower, TailPosition
from glm53.probe.warmup import WarmUp, send
from glm53.profiles import PROFILES, ModelProfile, get_profile

# Read a backlog in batches of this many bytes so memory stays flat on a multi-gigabyte first scan; the state is saved
# after each batch.
_BATCH_BYTES = 4 * 1024 * 1024
# The kubelet kills an exec probe after timeoutSeconds (default 1 s) and then nothing would be saved; under this budget
# a huge backlog is read over several invocations instead, each answering "not yet" until it has caught up.
_DEFAULT_TIME_BUDGET = 0.7
_STATE_VERSION = 1
_DEFAULT_WARM_UP_TIMEOUT = 8.0


def _build_parser() -> argparse.ArgumentParser:
    parser = command_parser("probe", "Probes for the kubelet.")
    probes = parser.add_subparsers(dest="probe", required=True, metavar="PROBE")
    startup = probes.add_parser(
        "startup",
        help="exit 0 only when vLLM and LMCache agreed on the geometry the model needs (3: not yet, 4: wrong)",
        description="Exit 0 when the logged cache geometry is right, 3 while vLLM is still loading, 4 when it is "
        "wrong or the server/engine failed. Prints one line.",
    )
    startup.add_argument("--profile", required=True, help=f"model profile: {', '.join(PROFILES)}")
    startup.add_argument("--tensor-parallel-size", metavar="T", help="vLLM's TP size (default: the profile's)")
    startup.add_argument(
        "--chunk-size",
        metavar="C",
        help="the LMCache server's configured --chunk-size; the server must log the same ('TokenHasher initialized: "
        "chunk_size=C'), else the verdict is wrong (default: the size the server logs; not yet until it does)",
    )
    startup.add_argument(
        "--log", action="append", required=True, type=Path, metavar="FILE", help="a log to read (repeatable)"
    )
    startup.add_argument(
        "--time-budget",
        type=non_negative_seconds("0: no limit"),
        default=_DEFAULT_TIME_BUDGET,
        metavar="SECONDS",
        help="stop reading after this long and continue next time (default %(default)s; 0: no limit)",
    )
    startup.add_argument(
        "--warm-up",
        metavar="URL",
        help="the engine's base URL: once the geometry is right, Ready waits until the engine answered one "
        "completion of a chunk and a token there (starts LMCache's heartbeats; default: no warm-up)",
    )
    startup.add_argument("--served-model-name", metavar="NAME", help="the model name the warm-up request names")
    startup.add_argument(
        "--warm-up-timeout",
        type=positive_float,
        default=_DEFAULT_WARM_UP_TIMEOUT,
        metavar="SECONDS",
        help="how long the warm-up request may take (default %(default)g; keep it under the probe's timeoutSeconds)",
    )
    startup.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where positions and facts are kept (default: .probe/ beside the first log)",
    )
    return parser


def _positive_option(text: str | None, option: str, default: int) -> int:
    return default if text is None else parse_positive(text, option)


def state_path(state_dir: Path, log: Path) -> Path:
    """The state file of one log: its name for people, a checksum of its absolute path so two `vllm.log`s don't clash.

    (CRC-32 rather than a cryptographic hash: `binascii` is loaded anyway, `hashlib` would cost start-up time, and a
    state file records its log's path, so a collision only costs a rescan.)
    """
    checksum = binascii.crc32(os.path.abspath(log).encode("utf-8", "surrogateescape"))
    return state_dir / f"{log.name}-{checksum:08x}.json"


def _load_state(path: Path, log: Path) -> tuple[TailPosition, StartupFacts]:
    """The saved position and facts of `log`, or a fresh start when there are none or they cannot be trusted."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != _STATE_VERSION or data.get("log") != str(log):
            raise ValueError("state belongs to another log or version")
        return TailPosition.from_json(data.get("position")), StartupFacts.from_json(data.get("facts"))
    except (OSError, ValueError):
        # Missing, unreadable or corrupt: rescanning the log costs time once, trusting garbage would cost a verdict.
        return TailPosition(), StartupFacts()


def _save_state(path: Path, log: Path, position: TailPosition, facts: StartupFacts) -> None:
    """Write the state atomically (temp file, then rename), so a probe killed mid-write leaves the old state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"version": _STATE_VERSION, "log": str(log), "position": position.to_json(), "facts": facts.to_json()}
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(json.dumps(payload, separators=(",", ":")), encoding="utf-8")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


@dataclass(frozen=True)
class LogProgress:
    """What one invocation learned from one log: its facts, bytes read over its history, bytes left, a save problem,
    and whether the file exists yet."""

    facts: StartupFacts
    total_bytes: int
    unread_bytes: int
    problem: str | None
    missing: bool


def read_log(log: Path, state_dir: Path, deadline: float | None) -> LogProgress:
    """Bring one log's facts up to date, saving after every batch so a probe killed on its timeout still progresses.

    Stops at the end of the log, or at `deadline` (a `time.monotonic()` value) with the rest left for next time.
    """
    path = state_path(state_dir, log)
    position, facts = _load_state(path, log)
    follower = LogFollower(log, position)
    problem = None
    while True:
        before = follower.bytes_read
        facts.add_all(parse_lines(follower.read_new_lines(max_bytes=_BATCH_BYTES)))
        if follower.bytes_read == before:  # caught up; the last batch was saved already
            break
        try:
            _save_state(path, log, follower.position, facts)
        except OSError as error:
            problem = f"state not saved in {state_dir} ({error.strerror or error})"
        if deadline is not None and time.monotonic() > deadline:
            break
    return LogProgress(facts, follower.total_bytes_read, follower.unread_bytes(), problem, not log.exists())


def _read_logs(logs: list[Path], state_dir: Path, deadline: float | None) -> list[LogProgress]:
    """Every log's progress; a log that exists but cannot be read is bad input, said in one line."""
    progress = []
    for log in logs:
        try:
            progress.append(read_log(log, state_dir, deadline))
        except OSError as error:
            raise Glm53Error(
                f"cannot read --log {log}: {error.strerror or error}; expected a readable log file, such as the "
                "vllm.log or lmcache.log that glm53 supervise writes"
            ) from None
    return progress


def _name_missing(verdict: Verdict, progress: list[LogProgress], logs: list[Path]) -> Verdict:
    """A "not yet" names the logs that do not exist yet, so a wrong --log path does not pass for a slow start."""
    missing = [str(log) for log, p in zip(logs, progress, strict=True) if p.missing]
    if verdict.status is not Status.NOT_YET or not missing:
        return verdict
    reason = verdict.message.removeprefix(f"{Status.NOT_YET.value}: ")
    return Verdict.of(
        Status.NOT_YET,
        f"no file at {', '.join(missing)} yet (check --log if it never appears); {reason}",
    )


def _warmed_up(verdict: Verdict, facts: StartupFacts, args: argparse.Namespace, profile: ModelProfile) -> Verdict:
    """A Ready verdict stays Ready once the warm-up request was answered; until then it is "not yet", saying why."""
    if verdict.status is not Status.READY or args.warm_up is None:
        return verdict
    chunk_size = facts.negotiated.resolved if facts.negotiated else facts.server_chunk_size
    if chunk_size is None:  # Ready is only given once the server logged its size; never guess one
        return verdict
    token = profile.prompt_token_ids[0]
    api_key = os.environ.get("VLLM_API_KEY")  # the engine container's own key, as its readiness probe uses it
    problem = send(WarmUp(args.warm_up, args.served_model_name, chunk_size, token, args.warm_up_timeout, api_key))
    if problem is None:
        return Verdict.of(Status.READY, f"{verdict.message.split(': ', 1)[1]}; warm-up request answered")
    return Verdict.of(Status.NOT_YET, f"geometry right; waiting for the engine to answer the warm-up ({problem})")


def main(argv: Sequence[str]) -> int:
    args = _build_parser().parse_args(list(argv))
    if args.warm_up is not None and not args.served_model_name:
        raise Glm53Error("--warm-up needs --served-model-name: the model name the engine serves")
    profile = get_profile(args.profile)
    tensor_parallel_size = _positive_option(
        args.tensor_parallel_size, "--tensor-parallel-size", profile.tensor_parallel_size
    )
    # No default: the server logs the size it runs with, and a guessed 256 would judge a healthy 1152 pod wrong.
    chunk_size = None if args.chunk_size is None else parse_positive(args.chunk_size, "--chunk-size")
    logs: list[Path] = args.log
    state_dir: Path = args.state_dir or logs[0].parent / ".probe"
    deadline = time.monotonic() + args.time_budget if args.time_budget > 0 else None
    progress = _read_logs(logs, state_dir, deadline)
    facts = StartupFacts.combined(p.facts for p in progress)
    verdict = evaluate(
        profile,
        tensor_parallel_size,
        chunk_size,
        facts,
        sum(p.total_bytes for p in progress),
        unread_bytes=sum(p.unread_bytes for p in progress),
    )
    verdict = _warmed_up(_name_missing(verdict, progress, logs), facts, args, profile)
    # A state that cannot be saved only makes the next invocation rescan; the verdict itself still stands.
    problems = [p.problem for p in progress if p.problem]
    print(verdict.message + (f" [{problems[0]}]" if problems else ""))
    return verdict.exit_code
