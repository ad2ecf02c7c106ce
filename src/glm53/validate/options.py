"""`glm53 validate`'s options: the one parser of its flags, used by the command line and by the pod's runners.

Why here and not in `commands/`: the chart's `helm test` pod runs `glm53 validate` with flags the chart renders, and
the CPU runners (`glm53.pod.main_job`) run that same command line against the loopback pod. They must read it with
the parser the command itself uses, or a flag the chart adds would be dropped on CPU; the parser lives in the product
layer so that the runners never import from `commands/`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from glm53.errors import Glm53Error
from glm53.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from glm53.validate.continuations import DEFAULT_PAIRS, DEFAULT_TOKENS, TEMPLATES
from glm53.validate.prompts import document_qa_prompt, prompt_from_file
from glm53.validate.protocol import CHECKS
from glm53.validate.runner import (
    DEFAULT_ALPHA,
    DEFAULT_RUNS,
    DEFAULT_TIMEOUT,
    MIN_RUNS,
    RELOAD_SOURCES,
    ValidationConfig,
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
        "--runs",
        type=int,
        default=DEFAULT_RUNS,
        help=f"requests per condition, at least {MIN_RUNS} (default %(default)s)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=DEFAULT_PAIRS,
        help=f"paired continuations over the three templates, at least {len(TEMPLATES)} "
        "(default %(default)s, the seed's)",
    )
    parser.add_argument(
        "--continuation-tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help="tokens per paired continuation (default %(default)s, the seed's)",
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
    parser.add_argument(
        "--reload-from",
        choices=RELOAD_SOURCES,
        default="l1",
        help="where the reloads come from: l1 (default), LMCache's memory; l2, its L2 tier (lmcache.l2): each "
        "reload then also empties LMCache's L1 (reset_prefix_cache?reset_external=true), so the equivalence is "
        "checked on KV that went through the tier",
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
        reload_from=args.reload_from,
    )
