"""Entry point of the `glm53` command: picks a subcommand and imports only that subcommand's module.

The startup probe runs under the kubelet every few seconds for the whole model load, so start-up cost matters: this
module imports nothing beyond the standard library, and each subcommand module is loaded lazily by name.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from glm53.errors import EXIT_USAGE, Glm53Error

# name -> (module implementing `main(argv) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "profiles": ("glm53.commands.profiles", "print the model profiles (TP size, cache geometry, flags)"),
    "probe": ("glm53.commands.probe", "startup probe: refuse Ready until the cache geometry is right"),
    "chunk": ("glm53.commands.chunk", "chunk-size arithmetic: coverage, negotiation, recommendation"),
    "mock": ("glm53.commands.mock", "CPU stand-ins for `lmcache server` and `vllm serve`"),
    "supervise": ("glm53.commands.supervise", "container entrypoint: run a server, tee and rotate its log"),
    "validate": ("glm53.commands.validate", "cold-versus-cached validation protocol against a deployment"),
    "pod": ("glm53.commands.pod", "run the CPU-mock pod on this machine and validate it (the README's main job)"),
    "exporter": ("glm53.commands.exporter", "Prometheus exporter joining log facts with vLLM and LMCache metrics"),
    "kind-smoke": ("glm53.commands.kind_smoke", "kind-cluster smoke test of the chart in CPU-mock mode"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: glm53 COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run `glm53 COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help"}:
        print(_usage())
        return 0 if args else EXIT_USAGE
    if args[0] == "--version":
        from glm53 import __version__

        print(f"glm53 {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"glm53: error: unknown command {name!r}; expected one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(COMMANDS[name][0])
    try:
        return int(module.main(rest))
    except Glm53Error as error:
        print(f"glm53 {name}: error: {error.message}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print(f"glm53 {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`glm53 profiles --json | head`): not an error worth a traceback. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
