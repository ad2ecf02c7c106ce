"""`glm53 faults`: the sidecar's faults on the chart's CPU pod, under load; one table per setting (glm53.pod.faults).

Exit 0 when, with the chart's settings, every fault ended with no failed and no hung request, LMCache's hits back
within HITS_BACK_BOUND_S, and at least KEPT_BOUND of the hit tokens of the documents stored before the fault (the L2
tier's promise); 1 otherwise; 2 for usage errors. The chart's settings without the L2 tier and upstream's defaults
are measured for comparison only: their losses are the point of the table, not a failure of the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from glm53.commands.parser import command_parser
from glm53.commands.session import add_session_arguments, session
from glm53.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Glm53Error
from glm53.pod.contract import ENGINES
from glm53.pod.faults.load import LoadShape
from glm53.pod.faults.suite import FAULTS, SETTINGS, START_FAULTS, SuiteOptions, parse_faults, run_suite
from glm53.pod.faults.table import FaultRow, format_table
from glm53.pod.main_job import engine_and_profile, say_to
from glm53.pod.prometheus import find_tool
from glm53.profiles import PROFILES

# The bound the chart's settings are held to, from the sidecar answering again (its restart held 25 s, then its own
# start-up): the engine's next ping (10 s apart) registers again, and the next document stored is found whole.
HITS_BACK_BOUND_S = 60.0
# The share of the hit tokens of documents stored before a fault that the chart's L2 tier keeps through it.
KEPT_BOUND = 0.95


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "faults",
        "Run the chart's CPU pod on loopback (restarting containers as the kubelet does), put it under "
        "load, and hurt its LMCache sidecar: kill, term, freeze, kill-slow, an idle engine past the reaper, and the "
        "sidecar gone when the engine starts (absent: back within the connector's mq_timeout; absent-long: past it). "
        "Prints, per setting: requests sent / failed / hung, seconds until LMCache hits return, hit tokens after "
        "recovery against the expected number, the hit tokens of documents stored before the fault and sent after it, "
        "the containers restarted and, with --prometheus, the chart's alerts each fault raised.",
    )
    parser.add_argument("--engine", choices=ENGINES, default="vllm", help="vllm (default, the real engine) or standin")
    parser.add_argument("--profile", choices=list(PROFILES), help="model profile (default: the engine's default)")
    parser.add_argument(
        "--settings",
        choices=[*SETTINGS, "all"],
        default="all",
        help="chart: the chart's values; chart-l1-only: the chart's without its L2 tier (lmcache.l2.type=off); "
        "upstream: vLLM's and LMCache's defaults; all (default)",
    )
    parser.add_argument(
        "--faults",
        metavar="LIST",
        help=f"comma-separated faults, played in this order whatever the list's: {', '.join(FAULTS)} (default: all; "
        "with --engine standin all but the absent ones)",
    )
    parser.add_argument("--clients", type=int, default=2, help="concurrent clients of the load (default %(default)s)")
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="watch each fault played on a Ready pod with a real Prometheus (scripts/setup.d/33-promtool.sh installs "
        "it) evaluating the chart's alerts: a column names the alerts raised and whether they cleared",
    )
    parser.add_argument("--json", dest="json_path", metavar="FILE", help="also write the rows as JSON")
    add_session_arguments(parser, "where each setting's pod keeps its volumes and container logs (kept)")
    return parser


def holds(rows: Sequence[FaultRow]) -> bool:
    """The chart's promise: nothing failed, nothing hung, the cache came back within the bound once the fault was over
    (the sidecar answering again), and it still held what was stored before the fault."""
    return all(
        r.failed == 0
        and r.hung == 0
        and r.recovery_s is not None
        and r.recovery_s <= HITS_BACK_BOUND_S
        and (r.kept_share is None or r.kept_share >= KEPT_BOUND)
        for r in rows
    )


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    say = say_to(sys.stdout)
    engine, profile = engine_and_profile(args.engine, args.profile, None)
    # The stand-in asks its server for the chunk size itself before it builds LMCache's adapters (glm53.mock.kv_client),
    # so the line an `absent` fault waits for (suite.CONNECTOR_ASKS) only comes once the server is back.
    default = [name for name in FAULTS if engine != "standin" or name not in START_FAULTS]
    names = default if args.faults is None else [name.strip() for name in args.faults.split(",") if name.strip()]
    faults = tuple(parse_faults(names))
    if engine == "standin" and any(f.name in START_FAULTS for f in faults):
        raise Glm53Error(
            "the absent faults need --engine vllm: the stand-in asks its server for the chunk size before LMCache's "
            "adapters log the line the fault waits for",
            EXIT_USAGE,
        )
    if args.clients < 1:
        raise Glm53Error(f"--clients must be at least 1, got {args.clients}")
    if args.prometheus:
        find_tool("prometheus")  # before any pod starts: a missing server is one line
    settings = list(SETTINGS) if args.settings == "all" else [args.settings]
    results: dict[str, list[FaultRow]] = {}
    with session("faults", args.workdir, args.keep) as run:
        for setting in settings:
            shape = LoadShape(clients=args.clients)
            options = SuiteOptions(
                profile, engine, setting, faults, shape, chart=args.chart, prometheus=args.prometheus
            )
            say(f"faults: {profile.name} on the {engine} engine, {setting} settings")
            results[setting] = run_suite(options, run.workdir / setting, say)
        for setting, rows in results.items():
            for line in format_table(f"\n{setting} settings ({engine} engine, {profile.name}):", rows):
                print(line)
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as out:
                json.dump({s: [asdict(r) for r in rows] for s, rows in results.items()}, out, indent=2)
        run.passed = holds(results.get("chart", []))
        if "chart" in results:
            verdict = "hold" if run.passed else "do NOT hold"
            say(
                f"faults: the chart's settings {verdict}: 0 failed, 0 hung, hits back within {HITS_BACK_BOUND_S:g} s "
                f"of the fault being over, at least {KEPT_BOUND:.0%} of what was stored before it hit after"
            )
        return EXIT_OK if run.passed or "chart" not in results else EXIT_FAILURE
