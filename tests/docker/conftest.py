"""Session fixtures of the Docker-marked tests: one private engine, its base image and the mock image per session.

Each is expensive on CI's 2 cores (the mock image carries torch and the real LMCache server), so every test shares them;
the machinery lives in `dockerkit.py`. Fixtures start only when a test asks for them: tests without the engine (such as
the LMCache host build) never start a daemon.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dockerkit import DockerEngine, MockImageBuild, build_mock_image, import_base_image, private_engine


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[DockerEngine]:
    """The session's private Docker engine; stopped by PID after the last test."""
    with private_engine() as engine:
        yield engine


@pytest.fixture(scope="session")
def debian_base_image(docker_engine: DockerEngine) -> str:
    """The debootstrapped Debian bookworm base image in the session's engine."""
    return import_base_image(docker_engine)


@pytest.fixture(scope="session")
def mock_image_build(
    docker_engine: DockerEngine, debian_base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> MockImageBuild:
    """The mock image, built once per session through `ansible/build-images.yml`."""
    return build_mock_image(docker_engine, debian_base_image, tmp_path_factory.mktemp("build-report") / "images.json")
