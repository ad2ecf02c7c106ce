"""`glm53 exporter --log FILE [--log FILE ...] --profile NAME --vllm-url URL --lmcache-url URL [--port 9400]`.

Wires the exporter together (see `glm53.exporter`) and serves it until SIGTERM or SIGINT. `--tensor-parallel-size`
and `--chunk-size` take the same meaning and defaults as the startup probe's, so the exporter's verdict is the probe's.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from prometheus_client.registry import CollectorRegistry

from glm53.chunks import require_positive
from glm53.errors import Glm53Error
from glm53.exporter import names
from glm53.exporter.collector import Glm53Collector, Upstream
from glm53.exporter.facts import LogWatch
from glm53.exporter.server import serve
from glm53.exporter.upstream import DEFAULT_TIMEOUT_SECONDS, metrics_url, scrape
from glm53.profiles import PROFILES, get_profile

DEFAULT_PORT = 9400


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm53 exporter",
        description="Prometheus exporter: start-up geometry facts from the logs joined with vLLM's and LMCache's "
        "cache metrics.",
    )
    parser.add_argument("--log", action="append", required=True, type=Path, help="log file to follow (repeatable)")
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES), help="model profile")
    parser.add_argument("--tensor-parallel-size", type=int, help="vLLM's TP size (default: the profile's)")
    parser.add_argument("--chunk-size", type=int, help="LMCache --chunk-size configured (default: the profile's)")
    parser.add_argument("--vllm-url", required=True, help="vLLM base or /metrics URL, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--lmcache-url", required=True, help="LMCache Prometheus base or /metrics URL, e.g. http://127.0.0.1:9090"
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"seconds to wait for each upstream per scrape (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    return parser


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def build_registry(args: argparse.Namespace) -> tuple[CollectorRegistry, Glm53Collector]:
    """The registry with the exporter's collector on it, from parsed arguments."""
    profile = get_profile(args.profile)
    tp = require_positive(_or(args.tensor_parallel_size, profile.tensor_parallel_size), "--tensor-parallel-size")
    chunk = require_positive(_or(args.chunk_size, profile.recommended_chunk_size), "--chunk-size")
    if not args.timeout > 0:
        raise Glm53Error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    upstreams = [
        Upstream(names.VLLM, metrics_url(args.vllm_url)),
        Upstream(names.LMCACHE, metrics_url(args.lmcache_url)),
    ]
    timeout = float(args.timeout)
    collector = Glm53Collector(
        LogWatch(args.log, profile, tp, chunk), upstreams, lambda url: scrape(url, timeout=timeout)
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
