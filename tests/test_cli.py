"""The `glm53` dispatcher: unknown commands, help, version, and a reader that goes away."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from collections.abc import Callable, Sequence

import pytest

from glm53.cli import COMMANDS, main
from glm53.errors import Glm53Error


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "glm53", *args], capture_output=True, text=True, timeout=60)


def test_unknown_command_is_one_line_and_exit_2() -> None:
    result = run("deploy")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"glm53: error: unknown command 'deploy'; expected one of: {', '.join(COMMANDS)}"
    ]


def test_help_lists_every_command() -> None:
    assert main(["--help"]) == 0
    result = run("--help")
    for name in COMMANDS:
        assert f"  {name} " in result.stdout


def test_no_arguments_is_a_usage_error() -> None:
    result = run()
    assert result.returncode == 2
    assert result.stdout.startswith("usage: glm53 COMMAND")


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("glm53 ")


def test_a_closed_pipe_is_not_a_traceback() -> None:
    # The reader (`true`) exits before the writer starts, so every write meets a closed pipe.
    command = f"(sleep 0.5; {sys.executable} -m glm53 profiles --json; echo $? >&2) | true"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == "141"


def _raising(error: BaseException) -> Callable[[Sequence[str]], int]:
    def command(argv: Sequence[str]) -> int:
        raise error

    return command


def _parsing(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="glm53 fake")
    parser.add_argument("--port", type=int, required=True)
    parser.parse_args(argv)
    return 0


@pytest.mark.parametrize(
    ("main_of_fake", "argv", "code", "line"),
    [
        (_raising(Glm53Error("no geometry line yet", 3)), [], 3, "glm53 fake: error: no geometry line yet"),
        (
            _raising(IsADirectoryError(21, "Is a directory", "/var/log")),
            [],
            1,
            "glm53 fake: error: /var/log: Is a directory",
        ),
        (
            _raising(PermissionError(13, "Permission denied", "vllm.log")),
            [],
            1,
            "glm53 fake: error: vllm.log: Permission denied",
        ),
        (
            _raising(OverflowError("bind(): port must be 0-65535.")),
            [],
            2,
            "glm53 fake: error: invalid value: bind(): port must be 0-65535.",
        ),
        (
            _raising(ValueError("unknown url type:\n'nan'")),
            [],
            2,
            "glm53 fake: error: invalid value: unknown url type: 'nan'",
        ),
        (
            _parsing,
            ["--port", "x"],
            2,
            "glm53 fake: error: argument --port: invalid int value: 'x' (see `glm53 fake --help`)",
        ),
        (_parsing, [], 2, "glm53 fake: error: the following arguments are required: --port (see `glm53 fake --help`)"),
    ],
)
def test_every_failure_is_one_line_on_stderr(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    main_of_fake: Callable[[Sequence[str]], int],
    argv: list[str],
    code: int,
    line: str,
) -> None:
    fake = types.ModuleType("glm53_fake_command")
    fake.main = main_of_fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(COMMANDS, "fake", (fake.__name__, "a command that fails"))
    assert main(["fake", *argv]) == code
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_usage_error_points_at_the_help_of_the_command_that_was_run(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main([name, "--no-such-flag"]) == 2
    assert capsys.readouterr().err.endswith(f" (see `glm53 {name} --help`)\n")


def test_argparse_errors_are_argparses_own_again_after_a_command() -> None:
    # The one-line form is the dispatcher's; a parser used outside it behaves as argparse documents.
    main(["profiles"])
    with pytest.raises(SystemExit):
        argparse.ArgumentParser(prog="p").parse_args(["--nope"])
