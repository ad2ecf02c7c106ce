"""`glm53 mock vllm MODEL ...`: the engine stand-in, with the flags the chart passes to `vllm serve`.

The flags mirror vLLM 0.33's (`vllm/entrypoints/common/cli_args.py` and the engine arguments) for everything the chart
renders, plus the stand-in's own knobs (`--profile`, `--load-seconds`, `--fault`, `--seed`, compute costs). Unknown
flags are rejected by argparse, like the real CLI does. The sidecar is the real `lmcache server` (the `pod` extra);
there is no LMCache stand-in.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from glm53.commands.argtypes import json_object, positive_int
from glm53.commands.parser import command_parser
from glm53.mock import vllm_server
from glm53.mock.connector import parse_connector_config, parse_kv_events_config
from glm53.mock.engine import FAULTS
from glm53.mock.model import ComputeCost
from glm53.profiles import PROFILES, get_profile

DEFAULT_MAX_MODEL_LEN = 131_072


def _add_vllm(subparsers: Any) -> None:
    p = subparsers.add_parser("vllm", help="stand-in for `vllm serve` with the LMCache MP connector")
    p.add_argument("model", help="model id, e.g. zai-org/GLM-5.3-Flash")
    p.add_argument("--profile", choices=tuple(PROFILES), required=True, help="which model profile to emulate")
    p.add_argument("--host", default="127.0.0.1", help="API host (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="API port (default %(default)s)")
    p.add_argument("--tensor-parallel-size", type=positive_int, required=True)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens (vLLM reports it only with this flag)",
    )
    p.add_argument("--kv-transfer-config", required=True, help="JSON; kv_connector must be LMCacheMPConnector")
    p.add_argument(
        "--kv-events-config",
        help="JSON (vllm/config/kv_events.py): publish KV-cache events over ZMQ in vLLM 0.33's wire format",
    )
    p.add_argument(
        "--enable-scale-out",
        action="store_true",
        help="serve /v1/completions/render and /v1/chat/completions/render (vLLM answers 403 there without it)",
    )
    p.add_argument("--limit-mm-per-prompt", type=json_object)
    p.add_argument("--tokenizer-mode")
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--speculative-config", type=json_object)
    p.add_argument("--kv-cache-dtype", choices=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"), default="auto")
    p.add_argument("--served-model-name", help="name clients use (default: the model id)")
    p.add_argument("--max-model-len", type=positive_int, default=DEFAULT_MAX_MODEL_LEN)
    p.add_argument("--num-gpu-blocks-override", type=positive_int, help="local prefix-cache capacity in blocks")
    p.add_argument("--load-seconds", type=float, default=2.0, help="simulated model load time (default %(default)g)")
    p.add_argument("--fault", choices=FAULTS, help="inject a known failure (recovery-mismatch: seed 004)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first-token log-prob noise (default %(default)s)")
    p.add_argument(
        "--prefill-us-per-token", type=float, default=5.0, help="simulated prefill cost (default %(default)g)"
    )
    p.add_argument("--decode-ms-per-token", type=float, default=0.5, help="simulated decode cost (default %(default)g)")


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser("mock", "the CPU stand-in for `vllm serve` (the LMCache sidecar is the real server)")
    subparsers = parser.add_subparsers(dest="server", required=True, metavar="{vllm}")
    _add_vllm(subparsers)
    return parser


def _vllm_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> vllm_server.VllmConfig:
    defaults = parser.parse_args(
        ["vllm", args.model, "--profile", args.profile, "--tensor-parallel-size", "1", "--kv-transfer-config", "{}"]
    )
    non_default = {
        name: value
        for name, value in vars(args).items()
        if name not in ("server", "model") and value != getattr(defaults, name)
    }
    return vllm_server.VllmConfig(
        model=args.model,
        profile=get_profile(args.profile),
        host=args.host,
        port=args.port,
        tensor_parallel_size=args.tensor_parallel_size,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        connector=parse_connector_config(args.kv_transfer_config),
        served_model_name=args.served_model_name or args.model,
        load_seconds=args.load_seconds,
        fault=args.fault,
        seed=args.seed,
        max_model_len=args.max_model_len,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        cost=ComputeCost(args.prefill_us_per_token * 1e-6, args.decode_ms_per_token * 1e-3),
        kv_events=None if args.kv_events_config is None else parse_kv_events_config(args.kv_events_config),
        enable_scale_out=args.enable_scale_out,
        non_default_args=non_default,
    )


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return vllm_server.serve(_vllm_config(args, parser))
