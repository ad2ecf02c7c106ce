"""No argv can make `glm53` print a traceback: every subcommand's real options with garbage values (property test).

The option names are read from each subcommand's own parser (the one `glm53 COMMAND --help` prints), so a new option
is fuzzed the day it is added. Values mix garbage (nan, inf, -1, 99999, unicode, directories, missing and junk files)
with a few plausible ones so that argv gets past argparse and into each command's own checks. Whatever the argv, the
outcome must be an exit status; a failure ends in exactly one `glm53 COMMAND: error: ...` line, preceded at most by
the command's own progress lines (`validate: connecting to ...`); `SystemExit` may only come from `--help`.

Commands that serve until stopped never get a usable port: the mock servers and the exporter run as subprocesses with
every port option set to an impossible value (a run that outlives its timeout is a finding: some value was accepted
that should not be); `pod`, `fleet` and `faults` always get an invalid `--profile` (so only their argument parsing is
covered); `kind-smoke` always runs with `--dry-run`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glm53.cli import COMMANDS, main
from tests.support.sessionrun import run_in_session

GARBAGE = ("nan", "inf", "-inf", "-1", "0", "99999", "1e309", "", " ", "☃", "ünïcødé", "\udcff", "-", "0x10", "[")
PLAUSIBLE = ("1", "64", "256", "1152,1152,0", "glm53", "glm53-flash", "http://127.0.0.1:1")
# What `supervise -- X` gets: garbage that no shell would find as a program (`[` is one, in /usr/bin).
NOT_COMMANDS = tuple(g for g in GARBAGE if g.strip() and shutil.which(g) is None)
IMPOSSIBLE_PORTS = ("-1", "65536", "99999", "nan", "", "☃")
SERVER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Option:
    flag: str
    takes_value: bool
    choices: tuple[str, ...]
    required: bool


@dataclass(frozen=True)
class Surface:
    """What one (sub)command accepts: its optional flags and, for REMAINDER commands, a trailing command."""

    path: tuple[str, ...]
    options: tuple[Option, ...]
    positionals: int
    remainder: bool


def _parser_of(command: str) -> argparse.ArgumentParser:
    """The parser `glm53 COMMAND --help` prints, caught as it prints."""
    seen: list[argparse.ArgumentParser] = []
    printing = mock.patch.object(argparse.ArgumentParser, "print_help", autospec=True, side_effect=seen.append)
    with printing, pytest.raises(SystemExit):
        main([command, "--help"])
    return seen[0]


def _surfaces(path: tuple[str, ...], parser: argparse.ArgumentParser) -> Iterator[Surface]:
    options: list[Option] = []
    positionals = 0
    remainder = False
    for action in parser._actions:
        if isinstance(action.choices, dict):  # sub-commands: name -> parser
            for name, sub in action.choices.items():
                yield from _surfaces((*path, name), sub)
        elif action.nargs == argparse.REMAINDER:
            remainder = True
        elif not action.option_strings:
            positionals += 1
        for flag in action.option_strings:
            if flag not in {"-h", "--help"}:
                choices = tuple(str(c) for c in action.choices or ())
                options.append(Option(flag, action.nargs != 0, choices, action.required))
    if not any(isinstance(action.choices, dict) for action in parser._actions):
        yield Surface(path, tuple(options), positionals, remainder)


@functools.cache
def surfaces() -> tuple[Surface, ...]:
    return tuple(s for command in COMMANDS for s in _surfaces((command,), _parser_of(command)))


def _is_port(option: Option) -> bool:
    return option.flag.endswith("port")


@dataclass(frozen=True)
class Paths:
    root: Path
    directory: str
    missing: str
    junk: str
    empty: str


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "junk.log").write_bytes(b"\xff\xfe not a log \x00\n" * 3)
    (root / "empty.txt").write_text("")
    (root / "a-directory").mkdir()
    return Paths(
        root,
        str(root / "a-directory"),
        str(root / "missing" / "file.log"),
        str(root / "junk.log"),
        str(root / "empty.txt"),
    )


def _values(option: Option, where: Paths) -> st.SearchStrategy[str]:
    garbage = (*GARBAGE, where.directory, where.missing, where.junk, where.empty)
    # No NUL and no lone surrogates: a real argv can hold neither (only `\udcff`-style escapes of undecodable bytes).
    text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
    anything = st.sampled_from(PLAUSIBLE + option.choices) | st.sampled_from(garbage) | text
    # Half the time a real choice, so argv gets past argparse to the checks behind it.
    return st.sampled_from(option.choices) | anything if option.choices else anything


@st.composite
def argv_for(draw: st.DrawFn, surface: Surface, where: Paths) -> list[str]:
    argv = list(surface.path)
    # Required options mostly come first, so that most argv get past argparse into the command's own checks.
    required = [o for o in surface.options if o.required]
    chosen = required if draw(st.integers(0, 9)) else []
    chosen += draw(st.lists(st.sampled_from(surface.options), max_size=6)) if surface.options else []
    argv += [draw(st.sampled_from(PLAUSIBLE) | st.sampled_from(GARBAGE)) for _ in range(surface.positionals)]
    for option in chosen:
        if option.takes_value:
            argv += [option.flag, draw(_values(option, where))]
        else:
            argv.append(option.flag)
    if surface.remainder and draw(st.booleans()):
        argv += ["--", draw(st.sampled_from((*NOT_COMMANDS, where.directory, where.missing, where.junk)))]
    return argv


def _server_argv(surface: Surface, argv: list[str]) -> list[str]:
    """`argv` with every port option last and impossible, so nothing can listen."""
    ports = [o.flag for o in surface.options if _is_port(o)]
    return [*argv, *(item for flag in ports for item in (flag, IMPOSSIBLE_PORTS[len(argv) % len(IMPOSSIBLE_PORTS)]))]


def _run_in_process(argv: list[str], cwd: Path) -> tuple[int, str]:
    """`glm53 ARGV` in this process, in `cwd` (relative paths in argv land there), with stdout and stderr caught."""
    stderr = io.StringIO()
    stdout = io.TextIOWrapper(io.BytesIO())  # with a .buffer, like the real stdout
    with contextlib.chdir(cwd), contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            code = main(argv)
        except SystemExit as stop:  # only --help may exit, and it exits 0
            assert stop.code == 0 and "--help" in argv, f"argv {argv!r} raised SystemExit({stop.code!r})"
            code = 0
    return code, stderr.getvalue()


def _run_as_process(argv: list[str], cwd: Path) -> tuple[int, str]:
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "DO_NOT_TRACK": "1"}
    try:
        done = run_in_session(
            [sys.executable, "-m", "glm53", *argv], timeout=SERVER_TIMEOUT_S, cwd=cwd, env=env, capture_stdout=False
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"argv {argv!r} was still running after {SERVER_TIMEOUT_S:g} s") from None
    return done.returncode, done.stderr


def _check(argv: list[str], code: int, stderr: str) -> None:
    """No traceback; a failure ends in exactly one error line, after at most the command's own progress lines."""
    assert "Traceback" not in stderr, f"argv {argv!r} printed a traceback:\n{stderr}"
    lines = stderr.strip().splitlines()
    if code == 0 or not lines:
        return
    command = argv[0]
    *before, last = lines
    assert last.startswith(f"glm53 {command}: error: "), f"argv {argv!r} exited {code}; stderr ends:\n{stderr}"
    assert all(line.startswith(f"{command}: ") for line in before), f"argv {argv!r}: more than one line:\n{stderr}"


# Always a parse error for the commands that start whole pods; kind-smoke only ever plans.
FORCED: dict[tuple[str, ...], list[str]] = {
    ("pod",): ["--profile", "nan"],
    ("fleet",): ["--profile", "nan"],
    ("faults",): ["--profile", "nan"],
    ("kind-smoke",): ["--dry-run"],
}


def _serves(surface: Surface) -> bool:
    """A command with a port to listen on: the mock servers, the exporter (and whatever comes next)."""
    return surface.path not in FORCED and any(_is_port(o) for o in surface.options)


SERVERS = [s for s in surfaces() if _serves(s)]
IN_PROCESS = [s for s in surfaces() if not _serves(s)]
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_every_command_is_fuzzed() -> None:
    fuzzed = {s.path[0] for s in surfaces()}
    assert fuzzed == set(COMMANDS)
    assert {("probe", "startup"), ("chunk", "recommend"), ("mock", "vllm")} <= {s.path for s in surfaces()}
    assert {("mock", "vllm"), ("exporter",)} <= {s.path for s in SERVERS}


@pytest.mark.parametrize("surface", IN_PROCESS, ids=lambda s: " ".join(s.path))
@FUZZ
@given(data=st.data())
def test_no_argv_gives_a_traceback(surface: Surface, paths: Paths, data: st.DataObject) -> None:
    argv = data.draw(argv_for(surface, paths))
    argv += FORCED.get(surface.path, [])
    code, stderr = _run_in_process(argv, paths.root)
    _check(argv, code, stderr)


@pytest.mark.parametrize("surface", SERVERS, ids=lambda s: " ".join(s.path))
@settings(FUZZ, max_examples=6)
@given(data=st.data())
def test_no_server_argv_gives_a_traceback(surface: Surface, paths: Paths, data: st.DataObject) -> None:
    argv = _server_argv(surface, data.draw(argv_for(surface, paths)))
    code, stderr = _run_as_process(argv, paths.root)
    assert code != 0, f"argv {argv!r} with an impossible port exited 0"
    _check(argv, code, stderr)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["supervise", "--log", "x.log", "--max-log-mb", "inf", "--", "true"], "argument --max-log-mb: expected a"),
        (["supervise", "--log", "x.log", "--max-log-mb", "nan", "--", "true"], "got 'nan'"),
        (["chunk", "recommend", "--limit"], "argument --limit: expected one argument"),
        (["probe", "startup", "--profile", "glm53", "--log", "."], ".: Is a directory"),
    ],
)
def test_the_issues_cases_are_one_named_line(argv: list[str], message: str, tmp_path: Path) -> None:
    code, stderr = _run_in_process(argv, tmp_path)
    assert code != 0
    assert len(stderr.strip().splitlines()) == 1
    assert stderr.startswith(f"glm53 {argv[0]}: error: ") and message in stderr
