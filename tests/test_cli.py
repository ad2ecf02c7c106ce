"""The `glm53` dispatcher: unknown commands, help, version, and a reader that goes away."""

from __future__ import annotations

import subprocess
import sys

from glm53.cli import COMMANDS, main


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
