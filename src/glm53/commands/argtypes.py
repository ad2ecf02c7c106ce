"""Every argparse value check the subcommands use (`type=`), each written once.

A check turns one flag's text into its value or refuses it with `argparse.ArgumentTypeError`, whose message argparse
prefixes with the flag (`argument --max-workers: expected ...`) and the CLI prints as one line pointing at `--help`
(`glm53.cli`). So every message here is one line that says what was expected and repeats what was found, and no value
can escape as anything other than that error: a traceback is what `tests/test_cli_fuzz.py` looks for.

The startup probe imports this module every few seconds under the kubelet, so it uses the standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

MAX_PORT = 65535
# A found value longer than this is shown cut, with its length, so that the message stays a line a person reads.
_SHOWN_CHARS = 80


def _shown(text: str) -> str:
    """What was found, quoted as Python quotes it (escapes keep it on one line), cut when it is long."""
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return f"{text[:_SHOWN_CHARS]!r}... ({len(text)} characters)"


def positive_int(text: str) -> int:
    """A whole number of at least 1: a count of things (workers, replicas, GPUs, tokens, blocks).

    Zero of any of them is never meant: it would start nothing or divide by zero later, far from the flag.
    """
    try:
        value = int(text)
    except ValueError:  # also a number with more digits than Python converts, which is no count either
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {_shown(text)}")
    return value


def optional_port(text: str) -> int:
    """A TCP port to serve on, where 0 means serve nothing (the flag's default), so 0 to 65535.

    Refused here rather than by `bind`, which would fail only after the command has started its work.
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port from 0 (none) to {MAX_PORT}, got {_shown(text)}")
    return value


def host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` of a server to reach: a host name or address and a port from 1 to 65535."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port from 1 to {MAX_PORT}, got {_shown(text)}")
    return host, int(port)


def _float_or_nan(text: str) -> float:
    """`text` as a float, or nan when it is no number at all (so that one comparison refuses both)."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def positive_float(text: str) -> float:
    """A finite number above zero: a size, a timeout or an interval (fractions allowed).

    `float` alone accepts `nan`, which passes no comparison and so disables whatever limit the value is, and `inf`,
    which never arrives; `0` would mean "at once" or "nothing" where the flag means a real amount.
    """
    value = _float_or_nan(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {_shown(text)}")
    return value


def non_negative_seconds(zero_means: str) -> Callable[[str], float]:
    """The check for a flag of seconds that may be 0 to switch something off: finite and not negative.

    `nan` and `inf` are refused because each silently means something else (nan fails every comparison, so a limit
    of nan is no limit; inf never ends). What 0 switches off differs per flag, so the message names it: pass it as
    `zero_means`, e.g. "0: no limit".
    """

    def seconds(text: str) -> float:
        value = _float_or_nan(text)
        if not (math.isfinite(value) and value >= 0):
            raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0 ({zero_means}), got {_shown(text)}")
        return value

    seconds.__name__ = "non_negative_seconds"
    return seconds


# What a JSON value that is no object is, in words (looked up by exact type: to Python, `True` is an `int` too).
_JSON_KINDS: dict[type, str] = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (`{...}`), the form of vLLM's structured flags such as `--speculative-config`.

    Checked at parse time so a typo is one line naming the flag, not a failure once the engine reads the setting. A
    nesting too deep for Python's parser is refused like any other bad JSON, not raised as a RecursionError.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        found = f"not valid JSON: {error.msg} at character {error.pos + 1}"
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {_shown(text)} ({found})") from None
    except RecursionError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {_shown(text)} (nested too deeply)") from None
    if not isinstance(value, dict):
        kind = "null" if value is None else _JSON_KINDS.get(type(value), type(value).__name__)
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {_shown(text)} ({kind})")
    return value
