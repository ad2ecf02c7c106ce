"""Shared by the stage step's tests: the tiny model made once, the hub stand-in serving it, and the command run as the
container runs it (a subprocess of `glm53 stage-weights`, so a SIGKILL is a real one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from glm53 import tinymodels
from glm53.staging.layout import RepoLayout
from glm53.testing.hub_standin import HostedRepo, HubStandIn, host_directory

REPO = "glm53/tiny-dense"
WEIGHTS = "model.safetensors"


def tiny_dense_model(factory: pytest.TempPathFactory) -> Path:
    """The tiny dense model `glm53 tiny-model` makes, built once per session (every module's fixture shares it)."""
    directory = factory.getbasetemp() / "tiny-dense-model"
    if not (directory / tinymodels.MANIFEST).exists():
        tinymodels.build(tinymodels.get_shape("dense"), directory)
    return directory


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_dense_model(tmp_path_factory)


@pytest.fixture(scope="module")
def hosted(tiny_dense: Path) -> HostedRepo:
    return host_directory(REPO, tiny_dense)


@pytest.fixture
def hub(hosted: HostedRepo) -> Iterator[HubStandIn]:
    with HubStandIn([hosted]) as stand_in:
        yield stand_in


def command(cache: Path, endpoint: str, *extra: str) -> list[str]:
    program = [sys.executable, "-m", "glm53", "stage-weights", "run", "--repo", REPO, "--cache-dir", str(cache)]
    return [*program, "--endpoint", endpoint, "--progress-seconds", "0.5", *extra]


def stage(cache: Path, endpoint: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        command(cache, endpoint, *extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def start(cache: Path, endpoint: str, *extra: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as output:
        return subprocess.Popen(
            command(cache, endpoint, *extra), stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def layout(cache: Path) -> RepoLayout:
    return RepoLayout(cache, REPO)


def one_line(stderr: str) -> str:
    """The CLI's failure: exactly one line on stderr."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def same_files(model: Path, staged: Path) -> bool:
    """Every file `glm53 tiny-model` made is in the staged snapshot, byte for byte (the hub adds its .gitattributes)."""
    made = sorted(p.relative_to(model) for p in model.rglob("*") if p.is_file())
    return bool(made) and all((staged / path).read_bytes() == (model / path).read_bytes() for path in made)
