"""`glm53 validate`: the seeds' cold-versus-cached validation protocol against a running vLLM, real or mock.

Exit 0 when every chosen check passes, 1 when one fails, 2 for usage errors and for a server that cannot be validated
(unreachable, dev mode off, a counter missing): those say what to enable in one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from glm53.errors import EXIT_FAILURE, EXIT_OK, Glm53Error
from glm53.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from glm53.validate.continuations import DEFAULT_PAIRS, DEFAULT_TOKENS
from glm53.validate.progress import Progress
from glm53.validate.prompts import document_qa_prompt, prompt_from_file
from glm53.validate.protocol import CHECKS
from glm53.validate.report import ValidationReport, render_text, write_json
from glm53.validate.runner import (
    DEFAULT_ALPHA,
    DEFAULT_RUNS,
    DEFAULT_TIMEOUT,
    MIN_RUNS,
    ValidationConfig,
    run_validation,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm53 validate",
        description="Compare cold runs with runs served from LMCache (seed 000), check the strict-prefix bound at "
        "chunk boundaries, time the reload, compare paired continuations token by token (seed 004) and a restore "
        "mixing vLLM's prefix cache with LMCache (LMCache issue #4247). vLLM must run with VLLM_SERVER_DEV_MODE=1.",
    )
    parser.add_argument("--base-url", required=True, help="vLLM's OpenAI server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=list(PROFILES), help="model profile")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help=f"requests per condition, at least {MIN_RUNS} (default 16)"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"paired continuations over the three templates, at least 3 (default {DEFAULT_PAIRS}, the seed's)",
    )
    parser.add_argument(
        "--continuation-tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help=f"tokens per paired continuation (default {DEFAULT_TOKENS}, the seed's)",
    )
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="significance level of Welch's t-test")
    parser.add_argument("--chunk-size", type=int, help="the LMCache chunk size in use (default: the profile's)")
    parser.add_argument("--prompt-file", type=Path, help="document-QA prompt to use instead of the built-in one")
    parser.add_argument("--json", type=Path, help="also write the full report as JSON to this file")
    parser.add_argument("--plot", type=Path, help="also draw log-prob and TTFT distributions to this PNG")
    parser.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per HTTP request")
    parser.add_argument(
        "--lmcache-metrics",
        help="LMCache's Prometheus page (the server's, or the pod exporter's /metrics, which passes LMCache's counters "
        "through); after each prime, validation waits there until the server committed the prompt, so a reload "
        "never races the store",
    )
    return parser


def parse_checks(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in CHECKS]
    if unknown or not names:
        raise Glm53Error(f"--checks takes a comma-separated subset of {','.join(CHECKS)}, got {text!r}")
    return names


def config_from_args(args: argparse.Namespace) -> ValidationConfig:
    """The parsed flags as a configuration; `ValidationConfig` itself refuses values that make no sense."""
    return ValidationConfig(
        base_url=args.base_url,
        profile=get_profile(args.profile),
        checks=parse_checks(args.checks),
        runs=args.runs,
        pairs=args.pairs,
        continuation_tokens=args.continuation_tokens,
        alpha=args.alpha,
        chunk_size=args.chunk_size,
        prompt=prompt_from_file(args.prompt_file) if args.prompt_file else document_qa_prompt(),
        model=args.model,
        timeout=args.timeout,
        lmcache_metrics=args.lmcache_metrics,
    )


def write_outputs(report: ValidationReport, json_path: Path | None, plot_path: Path | None) -> None:
    if json_path is not None:
        write_json(report, json_path)
    if plot_path is not None:
        from glm53.validate.plot import write_plot

        write_plot(report, plot_path)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    report = run_validation(config_from_args(args), Progress(sys.stderr))
    print(render_text(report))
    write_outputs(report, args.json, args.plot)
    return EXIT_OK if report.passed else EXIT_FAILURE
