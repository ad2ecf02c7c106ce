"""Entry point of the `glm53` command: picks a subcommand and imports only that subcommand's module.

The startup probe runs under the kubelet every few seconds for the whole model load, so start-up cost matters: this
module imports nothing beyond the standard library, and each subcommand module is loaded lazily by name.

Every failure leaves as one line on stderr and a non-zero exit, never a traceback: `Glm53Error` carries its own
sentence; argparse's two-line "usage + error" becomes one line that points at `--help`; and the operating-system and
value errors a bad path or number can still cause deep inside a command are named in one line here, in one place,
instead of in every command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from glm53.errors import EXIT_FAILURE, EXIT_USAGE, Glm53Error

# name -> (module implementing `main(argv) -> int`, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "profiles": ("glm53.commands.profiles", "print the model profiles (TP size, cache geometry, flags)"),
    "probe": ("glm53.commands.probe", "startup probe: refuse Ready until the cache geometry is right"),
    "chunk": ("glm53.commands.chunk", "chunk-size arithmetic: coverage, negotiation, recommendation"),
    "mock": ("glm53.commands.mock", "CPU stand-ins for `lmcache server` and `vllm serve`"),
    "supervise": ("glm53.commands.supervise", "container entrypoint: run a server, tee and rotate its log"),
    "validate": ("glm53.commands.validate", "cold-versus-cached validation protocol against a deployment"),
    "pod": ("glm53.commands.pod", "run the CPU-mock pod on this machine and validate it (the README's main job)"),
    "faults": ("glm53.commands.faults", "hurt the CPU pod's LMCache sidecar under load; count what was lost"),
    "fleet": ("glm53.commands.fleet", "run N CPU-mock pods behind the real vllm-router and validate through it"),
    "exporter": ("glm53.commands.exporter", "Prometheus exporter joining log facts with vLLM and LMCache metrics"),
    "tiny-model": ("glm53.commands.tiny_model", "make a tiny CPU test model for the real vLLM engine (no download)"),
    "stage-weights": ("glm53.commands.stage_weights", "stage a model's weights before the engine starts (resumable)"),
    "kind-smoke": ("glm53.commands.kind_smoke", "kind-cluster smoke test of the chart in CPU-mock mode"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: glm53 COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run `glm53 COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def _argparse_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    raise Glm53Error(f"{message} (see `{parser.prog} --help`)")


@contextlib.contextmanager
def _one_line_argparse_errors() -> Iterator[None]:
    """Make every ArgumentParser (the subcommands' own and their sub-parsers) raise Glm53Error on a usage error.

    argparse prints the usage line and then the error and exits; patching the one method all parsers share keeps the
    nine commands' parsers plain argparse while the dispatcher decides what a usage error looks like.
    """
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _argparse_error  # type: ignore[assignment]
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original  # type: ignore[method-assign]


def _os_error_sentence(error: OSError) -> str:
    reason = error.strerror or str(error)
    names = [str(name) for name in (error.filename, error.filename2) if name is not None]
    return f"{' -> '.join(names)}: {reason}" if names else reason


def _fail(name: str, message: str, exit_code: int) -> int:
    print(f"glm53 {name}: error: {' '.join(message.split())}", file=sys.stderr)
    return exit_code


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
        with _one_line_argparse_errors():
            return int(module.main(rest))
    except Glm53Error as error:
        return _fail(name, error.message, error.exit_code)
    except KeyboardInterrupt:
        print(f"glm53 {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`glm53 profiles --json | head`): not an error worth a traceback. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as error:
        return _fail(name, _os_error_sentence(error), EXIT_FAILURE)
    except (ValueError, ArithmeticError) as error:
        return _fail(name, f"invalid value: {error}", EXIT_USAGE)
