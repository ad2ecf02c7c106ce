"""The argparse parser every subcommand starts from, named as the dispatcher names the command.

`glm53.cli` prints a command's failures as `glm53 COMMAND: error: ...` and ends a usage error with `(see `PROG
--help`)`, where PROG is the parser's own name; building each parser here keeps the two names the same. The one parser
built elsewhere, `glm53 validate`'s, lives in the product layer (`glm53.validate.options`, which may not import from
here) and spells its name out.
"""

from __future__ import annotations

import argparse


def command_parser(command: str, description: str) -> argparse.ArgumentParser:
    """The parser of `glm53 COMMAND`, with its `--help` description."""
    return argparse.ArgumentParser(prog=f"glm53 {command}", description=description)
