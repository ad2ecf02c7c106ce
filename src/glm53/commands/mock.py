"""`glm53 mock lmcache ...` and `glm53 mock vllm MODEL ...`: the CPU stand-ins, with the real servers' flags.

The LMCache flags mirror `lmcache server` of the 0.5.6 wheel (`lmcache/v1/multiprocess/config.py`,
`lmcache/v1/distributed/config.py`, `lmcache/v1/mp_observability/config.py`): same names, defaults and choices, and
`--l1-size-gb` / `--eviction-policy` are required. Two deliberate differences: `--host` defaults to 127.0.0.1 (the
pod keeps the request endpoint on loopback), and `--generation` picks the upstream generation to emulate. The vLLM
flags are the ones the chart passes to `vllm serve`, plus the mock's own knobs (`--profile`, `--load-seconds`,
`--fault`, `--seed`, compute costs). Unknown flags are rejected by argparse, like the real CLIs do.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from glm53.errors import Glm53Error
from glm53.mock import lmcache_server, vllm_server
from glm53.mock.connector import parse_connector_config
from glm53.mock.engine import FAULTS
from glm53.mock.handshake import GENERATIONS
from glm53.mock.model import ComputeCost
from glm53.mock.store import EVICTION_POLICIES
from glm53.profiles import PROFILES, get_profile

DEFAULT_MAX_MODEL_LEN = 131_072


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"invalid JSON ({error.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_lmcache(subparsers: Any) -> None:
    p = subparsers.add_parser("lmcache", help="stand-in for `lmcache server` (multiprocess mode)")
    p.add_argument("--host", default="127.0.0.1", help="request endpoint host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=5555, help="request endpoint port (default 5555)")
    p.add_argument("--chunk-size", type=_positive_int, default=256, help="chunk size in tokens (default 256)")
    p.add_argument(
        "--separate-object-groups",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="one object group per KV-cache group, needed by hybrid models (default False, as in 0.5.6)",
    )
    p.add_argument("--l1-size-gb", type=float, required=True, help="L1 memory in GiB (required)")
    p.add_argument("--eviction-policy", choices=EVICTION_POLICIES, required=True, help="L1 eviction policy (required)")
    p.add_argument("--http-host", default="127.0.0.1", help="HTTP frontend host (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=8080, help="HTTP frontend port (default 8080)")
    p.add_argument("--prometheus-port", type=int, default=9090, help="metrics port on 127.0.0.1 (default 9090)")
    p.add_argument(
        "--run-script-api-enabled",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="accepted so the mock takes the real server's arguments; enabling it is refused (remote code execution)",
    )
    p.add_argument(
        "--generation", choices=GENERATIONS, default="released", help="upstream behaviour to emulate (default released)"
    )


def _add_vllm(subparsers: Any) -> None:
    p = subparsers.add_parser("vllm", help="stand-in for `vllm serve` with the LMCache MP connector")
    p.add_argument("model", help="model id, e.g. zai-org/GLM-5.3-Flash")
    p.add_argument("--profile", choices=tuple(PROFILES), required=True, help="which model profile to emulate")
    p.add_argument("--host", default="127.0.0.1", help="API host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="API port (default 8000)")
    p.add_argument("--tensor-parallel-size", type=_positive_int, required=True)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--kv-transfer-config", required=True, help="JSON; kv_connector must be LMCacheMPConnector")
    p.add_argument("--limit-mm-per-prompt", type=_json_object)
    p.add_argument("--tokenizer-mode")
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--speculative-config", type=_json_object)
    p.add_argument("--kv-cache-dtype", choices=("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"), default="auto")
    p.add_argument("--served-model-name", help="name clients use (default: the model id)")
    p.add_argument("--max-model-len", type=_positive_int, default=DEFAULT_MAX_MODEL_LEN)
    p.add_argument("--num-gpu-blocks-override", type=_positive_int, help="local prefix-cache capacity in blocks")
    p.add_argument("--load-seconds", type=float, default=2.0, help="simulated model load time (default 2)")
    p.add_argument("--fault", choices=FAULTS, help="inject a known failure (recovery-mismatch: seed 004)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first-token log-prob noise (default 0)")
    p.add_argument("--prefill-us-per-token", type=float, default=5.0, help="simulated prefill cost (default 5)")
    p.add_argument("--decode-ms-per-token", type=float, default=0.5, help="simulated decode cost (default 0.5)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm53 mock", description="CPU stand-ins for `lmcache server` and `vllm serve`"
    )
    subparsers = parser.add_subparsers(dest="server", required=True, metavar="{lmcache,vllm}")
    _add_lmcache(subparsers)
    _add_vllm(subparsers)
    return parser


def _lmcache_config(args: argparse.Namespace) -> lmcache_server.LMCacheConfig:
    if args.run_script_api_enabled:
        raise Glm53Error(
            "--run-script-api-enabled turns on /run_script, which executes arbitrary Python (remote code execution); "
            "no deployment of this project enables it: drop the flag or pass --no-run-script-api-enabled"
        )
    return lmcache_server.LMCacheConfig(
        host=args.host,
        port=args.port,
        chunk_size=args.chunk_size,
        separate_object_groups=args.separate_object_groups,
        l1_size_gb=args.l1_size_gb,
        eviction_policy=args.eviction_policy,
        http_host=args.http_host,
        http_port=args.http_port,
        prometheus_port=args.prometheus_port,
        generation=args.generation,
    )


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
        connector=parse_connector_config(args.kv_transfer_config),
        served_model_name=args.served_model_name or args.model,
        load_seconds=args.load_seconds,
        fault=args.fault,
        seed=args.seed,
        max_model_len=args.max_model_len,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        cost=ComputeCost(args.prefill_us_per_token * 1e-6, args.decode_ms_per_token * 1e-3),
        non_default_args=non_default,
    )


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.server == "lmcache":
        return lmcache_server.serve(_lmcache_config(args))
    return vllm_server.serve(_vllm_config(args, parser))
