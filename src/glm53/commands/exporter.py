"""`glm53 exporter --log FILE [--log FILE ...] --profile NAME --vllm-url URL --lmcache-url URL [...] [--port 9400]`.

Wires the exporter together (see `glm53.exporter`) and serves it until SIGTERM or SIGINT. `--tensor-parallel-size`
and `--chunk-size` take the same meaning and defaults as the startup probe's, so the exporter's verdict is the probe's:
without `--chunk-size` the size the LMCache server logs at start is judged, never an assumed default.
Everything a flag can get wrong is refused before the server starts, in one line: a scrape must never be the first
place a bad flag shows (a log path that is a directory used to turn every scrape into an HTTP 500).
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from prometheus_client.registry import CollectorRegistry

from glm53.chunks import require_positive
from glm53.commands.argtypes import MAX_PORT
from glm53.commands.parser import command_parser
from glm53.errors import Glm53Error
from glm53.exporter import names
from glm53.exporter.collector import Glm53Collector, Upstream
from glm53.exporter.facts import LogWatch
from glm53.exporter.server import serve
from glm53.exporter.upstream import DEFAULT_TIMEOUT_SECONDS, metrics_url, read_api_key, registered_engines, scrape
from glm53.profiles import PROFILES, get_profile

DEFAULT_PORT = 9400


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "exporter",
        "Prometheus exporter: start-up geometry facts from the logs joined with vLLM's and LMCache's cache metrics.",
    )
    parser.add_argument("--log", action="append", required=True, type=Path, help="log file to follow (repeatable)")
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES), help="model profile")
    parser.add_argument("--tensor-parallel-size", type=int, help="vLLM's TP size (default: the profile's)")
    parser.add_argument(
        "--chunk-size",
        type=int,
        help="the LMCache server's configured --chunk-size; the server must log the same ('TokenHasher initialized: "
        "chunk_size=C'), else the verdict is wrong (default: the size the server logs; not_yet until it does)",
    )
    parser.add_argument("--vllm-url", required=True, help="vLLM base or /metrics URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--lmcache-url",
        action="append",
        required=True,
        help="`lmcache server`'s HTTP port (it serves /metrics there), base or /metrics URL, e.g. "
        "http://127.0.0.1:8080; repeat it once per server, in rank order, when the pod runs one server per TP rank",
    )
    parser.add_argument(
        "--lmcache-api-key-file",
        type=Path,
        help="the LMCache server's API key file (its --api-key-file, one line: the key), sent as a bearer token to "
        "its /metrics and /status; a negotiating server (lmcache 0.5.7) started with a key answers 401 without it "
        "(default: no key)",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port to listen on, 0 for any free one (default %(default)s)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help="seconds to wait for each upstream per scrape (default %(default)g)",
    )
    return parser


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def require_log_file(path: Path) -> None:
    """A log that does not exist yet is fine (the container creates it); one that can never be read is refused."""
    if path.is_dir():
        raise Glm53Error(
            f"--log {str(path)!r} is a directory; give the log file itself, e.g. {str(path / 'vllm.log')!r}"
        )
    if path.exists() and not os.access(path, os.R_OK):
        raise Glm53Error(f"--log {str(path)!r} is not readable by this user; fix its permissions or the path")


def build_registry(args: argparse.Namespace) -> tuple[CollectorRegistry, Glm53Collector]:
    """The registry with the exporter's collector on it, from parsed arguments."""
    profile = get_profile(args.profile)
    tp = require_positive(_or(args.tensor_parallel_size, profile.tensor_parallel_size), "--tensor-parallel-size")
    # No default: a guessed 256 reported a healthy 1152 pod as wrong; the server's own logged size is judged instead.
    chunk = None if args.chunk_size is None else require_positive(args.chunk_size, "--chunk-size")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise Glm53Error(f"--timeout must be a positive, finite number of seconds, got {args.timeout:g}")
    if not 0 <= args.port <= MAX_PORT:
        raise Glm53Error(f"--port must be a TCP port from 0 to {MAX_PORT}, got {args.port}")
    for path in args.log:
        require_log_file(path)
    lmcache_urls = [metrics_url(url) for url in args.lmcache_url]
    upstreams = [Upstream(names.VLLM, metrics_url(args.vllm_url))]
    upstreams += [Upstream(t, u) for t, u in zip(names.lmcache_targets(len(lmcache_urls)), lmcache_urls, strict=True)]
    timeout = float(args.timeout)
    status_urls = [url.removesuffix("/metrics") + "/status" for url in lmcache_urls]
    # Read once: a rotated key (the Secret updated) takes a restart of the exporter, as it does of the server.
    key = None if args.lmcache_api_key_file is None else read_api_key(args.lmcache_api_key_file)

    def registration() -> int:
        # One server per rank: each registers only its own rank, and a server that lost its engine rejects that
        # rank's stores, which makes every lookup miss (the connector takes the minimum over the servers, lmcache
        # 0.5.6 vllm_multi_process_adapter.py:1054-1068): the fewest any server has is what says caching is alive.
        return min(registered_engines(url, timeout=timeout, api_key=key) for url in status_urls)

    collector = Glm53Collector(
        LogWatch(args.log, profile, tp, chunk),
        upstreams,
        lambda url: scrape(url, timeout=timeout, api_key=key if url in lmcache_urls else None),
        registration,
    )
    registry = CollectorRegistry()
    registry.register(collector)
    return registry, collector


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    registry, collector = build_registry(args)
    try:
        server = serve(registry, args.host, args.port)
    except Glm53Error:
        collector.close()
        raise
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"glm53 exporter: serving http://{args.host}:{server.port}/metrics", flush=True)
    try:
        stop.wait()
    finally:
        server.close()
        collector.close()
    print("glm53 exporter: stopped", file=sys.stderr, flush=True)
    return 0
