"""The argparse value checks (`glm53.commands.argtypes`): what each accepts, what it refuses and the line it says.

Then the wiring: every command's flag is refused through the shared check, in the one line the CLI prints, and no
module but `argtypes` raises `argparse.ArgumentTypeError` (a check written a second time is written here instead).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import glm53
from glm53.cli import main
from glm53.commands.argtypes import json_object, non_negative_seconds, optional_port, positive_float, positive_int

SRC = Path(glm53.__file__).parent


def refusal(check: Callable[[str], Any], text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        check(text)
    return str(refused.value)


@pytest.mark.parametrize(
    ("text", "value"), [("1", 1), ("8", 8), (" 3 ", 3), ("+2", 2), ("1_000", 1000), ("9" * 30, int("9" * 30))]
)
def test_positive_int_accepts_whole_numbers_from_1(text: str, value: int) -> None:
    assert positive_int(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "1.5", "1e3", "x", "", "nan", "0x10", "9" * 5000])
def test_positive_int_refuses_anything_else_naming_the_value(text: str) -> None:
    shown = repr(text) if len(text) <= 80 else f"{text[:80]!r}... (5000 characters)"
    assert refusal(positive_int, text) == f"expected a whole number of at least 1, got {shown}"


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("1", 1), ("9090", 9090), ("65535", 65535)])
def test_optional_port_accepts_0_to_65535(text: str, value: int) -> None:
    assert optional_port(text) == value


@pytest.mark.parametrize("text", ["-1", "65536", "70000", "80.0", "http", ""])
def test_optional_port_refuses_what_is_no_port(text: str) -> None:
    assert refusal(optional_port, text) == f"expected a port from 0 (none) to 65535, got {text!r}"


@pytest.mark.parametrize(("text", "value"), [("1", 1.0), ("0.25", 0.25), ("1e300", 1e300), ("5e-324", 5e-324)])
def test_positive_float_accepts_finite_numbers_above_zero(text: str, value: float) -> None:
    assert positive_float(text) == value


@pytest.mark.parametrize("text", ["0", "-0.0", "-1", "nan", "inf", "-inf", "1e309", "x", ""])
def test_positive_float_refuses_zero_negatives_and_non_finite(text: str) -> None:
    assert refusal(positive_float, text) == f"expected a positive finite number, got {text!r}"


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("0.7", 0.7), ("25", 25.0), ("-0", 0.0)])
def test_non_negative_seconds_accepts_zero_and_more(text: str, value: float) -> None:
    assert non_negative_seconds("0: never")(text) == value


@pytest.mark.parametrize("text", ["-1", "-0.001", "nan", "inf", "1e309", "soon", ""])
def test_non_negative_seconds_refuses_negatives_and_non_finite_saying_what_0_means(text: str) -> None:
    message = refusal(non_negative_seconds("0: no limit"), text)
    assert message == f"expected a number of seconds >= 0 (0: no limit), got {text!r}"


def test_non_negative_seconds_reads_as_a_check_in_argparse() -> None:
    assert non_negative_seconds("0: never").__name__ == "non_negative_seconds"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("{}", {}),
        ('{"image":0,"video":0}', {"image": 0, "video": 0}),
        (' {"a": [1, {"b": null}]} ', {"a": [1, {"b": None}]}),
    ],
)
def test_json_object_accepts_objects(text: str, value: dict[str, Any]) -> None:
    assert json_object(text) == value


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("[]", "an array"),
        ('"a"', "a string"),
        ("3", "a number"),
        ("1.5", "a number"),
        ("true", "a boolean"),
        ("null", "null"),
        ("", "not valid JSON: Expecting value at character 1"),
        ("{", "not valid JSON: Expecting property name enclosed in double quotes at character 2"),
        ("{'a': 1}", "not valid JSON: Expecting property name enclosed in double quotes at character 2"),
        ('{"a": 1} x', "not valid JSON: Extra data at character 10"),
    ],
)
def test_json_object_refuses_other_json_and_non_json_saying_what_it_found(text: str, found: str) -> None:
    assert refusal(json_object, text) == f"expected a JSON object, got {text!r} ({found})"


def test_json_object_refuses_nesting_too_deep_for_the_parser_in_one_short_line() -> None:
    text = "[" * 100_000
    assert refusal(json_object, text) == (
        f"expected a JSON object, got {'[' * 80!r}... (100000 characters) (nested too deeply)"
    )


@pytest.mark.parametrize(
    "check", [positive_int, optional_port, positive_float, non_negative_seconds("0: never"), json_object]
)
@pytest.mark.parametrize("text", ["a\nb", "\r", "\udcff", "☃", "\x00"])
def test_every_refusal_is_one_line_that_quotes_the_value(check: Callable[[str], Any], text: str) -> None:
    message = refusal(check, text)
    assert message.isprintable() and f"got {text!r}" in message


# (argv, the flag, its refusal) through `glm53`: each command's flag uses the shared check.
WIRED = [
    (["stage-weights", "run", "--max-workers", "0"], "--max-workers", "expected a whole number of at least 1, got '0'"),
    (["stage-weights", "run", "--metrics-port", "65536"], "--metrics-port", "expected a port from 0 (none) to 65535"),
    (["stage-weights", "run", "--progress-seconds", "nan"], "--progress-seconds", "expected a positive finite number"),
    (["fleet", "--replicas", "0"], "--replicas", "expected a whole number of at least 1, got '0'"),
    (["mock", "vllm", "m", "--tensor-parallel-size", "0"], "--tensor-parallel-size", "expected a whole number"),
    (["mock", "vllm", "m", "--max-model-len", "-1"], "--max-model-len", "expected a whole number of at least 1"),
    (["mock", "vllm", "m", "--num-gpu-blocks-override", "x"], "--num-gpu-blocks-override", "expected a whole number"),
    (["mock", "vllm", "m", "--limit-mm-per-prompt", "[]"], "--limit-mm-per-prompt", "expected a JSON object"),
    (["mock", "vllm", "m", "--speculative-config", "{"], "--speculative-config", "expected a JSON object, got '{'"),
    (["supervise", "--max-log-mb", "0"], "--max-log-mb", "expected a positive finite number, got '0'"),
    (
        ["supervise", "--hold-after-restart", "-1"],
        "--hold-after-restart",
        "expected a number of seconds >= 0 (0: never)",
    ),
    (["probe", "startup", "--time-budget", "inf"], "--time-budget", "expected a number of seconds >= 0 (0: no limit)"),
    (["probe", "startup", "--warm-up-timeout", "0"], "--warm-up-timeout", "expected a positive finite number"),
]


@pytest.mark.parametrize(("argv", "flag", "message"), WIRED, ids=[f"{w[0][0]} {w[1]}" for w in WIRED])
def test_each_commands_flag_is_refused_by_the_shared_check_in_one_line(
    argv: list[str], flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.endswith(" --help`)\n"), error
    assert error.startswith(f"glm53 {argv[0]}: error: argument {flag}: {message}"), error


def test_no_module_but_argtypes_writes_an_argparse_check() -> None:
    writers = {
        path.relative_to(SRC).as_posix()
        for path in SRC.rglob("*.py")
        if "ArgumentTypeError" in path.read_text(encoding="utf-8")
    }
    assert writers == {"commands/argtypes.py"}
