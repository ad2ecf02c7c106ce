"""Parse command lines with the released upstream parsers, in a Python that has them; writes the results as JSON.
Run as `python upstream_parse.py vllm|lmcache OUT.json` with a JSON list of argv lists on stdin (each argv is what
follows `vllm serve` or `lmcache server`), or `vllm-environ` with a JSON list of environments (name to value); the
results go to OUT.json, a list in the same order (stdout belongs to the upstream loggers). It imports the upstream
packages, so it runs in a conformance venv (vLLM 0.33.0 or 0.34.0: `.tools/upstream-parsers-venv-<version>`) or the
project's .venv (LMCache 0.5.6), never inside pytest. Each result is `{"ok": {...}}` with what the server would use, or
`{"error": "..."}` with the parser's own message.

The parsers are built the way each CLI builds them, from upstream code, so abbreviations, `--a_b` spellings and
last-occurrence-wins behave as in production:
- vLLM: `vllm/entrypoints/cli/main.py` makes a FlexibleArgumentParser with subcommands and
  `ServeSubcommand.subparser_init` (`vllm/entrypoints/cli/serve.py:161-175`) adds `make_arg_parser`;
  `validate_parsed_serve_args` and `AsyncEngineArgs.from_cli_args` then run as `vllm serve` runs them before loading a
  model.
- LMCache: `lmcache/cli/main.py:36-42` makes an ArgumentParser whose subcommands come from `register_commands`; the
  `server` command turns the namespace into configs with `parse_args_to_*_config` (`lmcache/cli/commands/server.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
from collections.abc import Callable
from typing import Any


def _jsonable(value: Any) -> Any:
    """Dataclasses and pydantic models as dicts, anything else exotic as its string."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _vllm_parse(argv: list[str]) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found,unused-ignore]
    from vllm.entrypoints.cli.serve import ServeSubcommand  # type: ignore[import-not-found,unused-ignore]
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args  # type: ignore[import-not-found,unused-ignore]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found,unused-ignore]

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    validate_parsed_serve_args(args)
    # vllm/entrypoints/cli/serve.py:55-57: the positional model tag takes precedence over --model.
    if args.model_tag is not None:
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    return {"args": _jsonable(vars(args)), "engine": _jsonable(engine)}


def _lmcache_parse(argv: list[str]) -> dict[str, Any]:
    from lmcache.cli.commands import register_commands
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
    from lmcache.v1.multiprocess.config import parse_args_to_http_frontend_config, parse_args_to_mp_server_config

    tokens = ["server", *argv]
    parser = argparse.ArgumentParser(prog="lmcache")
    register_commands(parser.add_subparsers(dest="command"), tokens)
    args = parser.parse_args(tokens)
    namespace = {k: v for k, v in vars(args).items() if k != "func"}
    return {
        "args": _jsonable(namespace),
        "http": _jsonable(parse_args_to_http_frontend_config(args)),
        "mp": _jsonable(parse_args_to_mp_server_config(args)),
        # Each --l2-adapter as the server builds it (its type's from_dict), named by its config class.
        "l2": [
            {"class": type(c).__name__, **_jsonable(vars(c))} for c in parse_args_to_l2_adapters_config(args).adapters
        ],
    }


def _vllm_environ(env: dict[str, str]) -> dict[str, Any]:
    """vLLM's own check of the environment (`validate_environ`, which `EngineArgs.create_engine_config` runs before
    the engine starts; vllm 0.34.0 vllm/platforms/interface.py:1476), strict: an unknown VLLM_ variable fails too.
    `env` stands for the container's environment: every VLLM_ variable of this process is left out meanwhile."""
    from vllm import envs  # type: ignore[import-not-found,unused-ignore]
    from vllm.platforms import current_platform  # type: ignore[import-not-found,unused-ignore]

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k, v in saved.items() if not k.startswith("VLLM_")} | env)
    try:
        current_platform.validate_environ(True)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"removed": sorted(getattr(envs, "removed_environment_variables", {}))}


PARSERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "vllm": _vllm_parse,
    "lmcache": _lmcache_parse,
    "vllm-environ": _vllm_environ,
}


def parse_one(tool: str, argv: Any) -> dict[str, Any]:
    """One argv's (for `vllm-environ`: one environment's) result; argparse's exit (its message on stderr) and config
    errors become {"error": message}."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return {"ok": PARSERS[tool](argv)}
    except SystemExit:
        return {"error": stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else "exit"}
    except (ValueError, TypeError) as error:
        return {"error": f"{type(error).__name__}: {error}"}


def main() -> int:
    tool = sys.argv[1]
    # vLLM picks its platform at import; a CPU machine has no CUDA, so say CPU (parsing does not depend on it).
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    results = [parse_one(tool, argv) for argv in json.load(sys.stdin)]
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(results, out, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
