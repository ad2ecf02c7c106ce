"""`glm53 stage-weights run|status`: stage a model's weights before the engine starts, and the probe that waits for it.

`run` downloads the repository at a revision into the Hugging Face cache (resumable, every file verified against the
hashes the hub lists, a completion marker last; `glm53.staging`) and prints progress lines. By default it exits: 0 when
the weights are staged, 1 with one line saying why not. With `--keep-running` (the chart's stage container, a native
sidecar) it retries a failed attempt by itself instead of exiting, so the pod never crash-loops, and stays up after
success to serve its metrics. `status` is that container's startup probe: it reads the status file `run` keeps and
exits 0 once staged, 3 while staging, 4 after a failed attempt, printing one line the kubelet puts into the pod's
events. `status` imports the standard library only; `run` imports huggingface_hub.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from glm53.commands.argtypes import optional_port, positive_float, positive_int
from glm53.commands.parser import command_parser
from glm53.errors import EXIT_OK, Glm53Error
from glm53.staging.status import read_status


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "stage-weights",
        "Stage a Hugging Face model repository into the cache on the weights volume before the engine "
        "starts (resumable, verified, a completion marker), and the probe that waits for it.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="stage the repository (exit 0: staged; 1: one line saying why not)")
    run.add_argument("--repo", required=True, help="repository id, e.g. zai-org/GLM-5.3")
    run.add_argument("--revision", default="main", help="branch, tag or 40-character commit (default: %(default)s)")
    run.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub",
        help="the Hugging Face cache to stage into (default: $HF_HOME/hub, as the engine reads it)",
    )
    run.add_argument("--endpoint", help="the hub's URL (default: $HF_ENDPOINT, else https://huggingface.co)")
    run.add_argument("--token-file", type=Path, help="a file holding the hub token (the mounted Secret)")
    run.add_argument("--max-workers", type=positive_int, default=8, help="files fetched at once (default %(default)s)")
    run.add_argument(
        "--reverify",
        choices=("sizes", "full"),
        default="sizes",
        help="what a completion marker found at the start is checked with: every file's size (default; seconds) "
        "or every byte hashed again (minutes per 100 GB)",
    )
    run.add_argument("--link", type=Path, help="make this path a symlink to the staged snapshot")
    run.add_argument("--status-file", type=Path, help="where to keep the status the `status` probe reads")
    run.add_argument(
        "--progress-seconds",
        type=positive_float,
        default=30.0,
        help="seconds between progress lines (default %(default)g)",
    )
    run.add_argument(
        "--metrics-port", type=optional_port, default=0, help="serve Prometheus metrics on this port (0: none)"
    )
    run.add_argument("--metrics-host", default="127.0.0.1", help="address the metrics bind (default 127.0.0.1)")
    run.add_argument(
        "--keep-running",
        action="store_true",
        help="retry failed attempts instead of exiting, and stay up after success (the chart's stage container)",
    )
    status = commands.add_parser("status", help="the stage container's startup probe (0 staged, 3 not yet, 4 failed)")
    status.add_argument("--status-file", type=Path, required=True, help="the status file `run` keeps")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "status":
        code, line = read_status(args.status_file)
        print(line)
        return code
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from glm53.staging import hub, stager

    config = stager.StageConfig(
        repo_id=args.repo,
        revision=args.revision,
        cache_dir=args.cache_dir,
        endpoint=args.endpoint,
        token_file=args.token_file,
        max_workers=args.max_workers,
        reverify=args.reverify,
        link=args.link,
        progress_s=args.progress_seconds,
    )
    say = stager.say_to_stdout
    state = stager.StageState(config.repo_id, config.revision)
    if hub.INSTALLED_VERSION != hub.VERIFIED_VERSION:
        say(
            f"stage-weights: huggingface_hub {hub.INSTALLED_VERSION} is installed; this stage step was read against "
            f"{hub.VERIFIED_VERSION} (cache layout, resumable download): check its output"
        )
    stop = threading.Event()
    reporter = stager.Reporter(state, args.status_file, config.progress_s, say)

    def stopped(signum: int, _frame: FrameType | None) -> None:
        # A partial download is resumed by the next start, so there is nothing to wait for: record it and leave
        # now (the download threads cannot be interrupted; waiting for them would outlast the grace period).
        state.update(detail=f"stopped by signal {signum}; a restart resumes where it stopped")
        reporter.write()
        say(f"stage-weights: stopped by signal {signum}: {state.current().line()}")
        os._exit(0 if args.keep_running else 128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    if args.metrics_port:
        from glm53.staging.metrics import serve

        try:
            serve(state, args.metrics_host, args.metrics_port)
        except OSError as error:
            raise Glm53Error(
                f"cannot serve metrics on {args.metrics_host}:{args.metrics_port} ({error.strerror}); choose another "
                "--metrics-port (weights.staging.metrics.port)"
            ) from None
    target = f"{config.repo_id}@{config.revision}"
    say(f"stage-weights: staging {target} into {config.cache_dir} ({config.context().endpoint})")
    with reporter:
        if not args.keep_running:
            result = stager.attempt_once(config, state, say)
            say(f"stage-weights: {state.current().line()}")
            print(f"stage-weights: staged {target} at commit {result.commit}", file=sys.stdout, flush=True)
            return EXIT_OK
        result_or_none = stager.run_resident(config, state, say, stop)
        if result_or_none is not None:
            say(f"stage-weights: {state.current().line()}")
            say("stage-weights: staying up to serve its status and metrics until the pod stops")
        reporter.write()
        stop.wait()  # until SIGTERM, which leaves through `stopped`
    return EXIT_OK
