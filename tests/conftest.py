"""The suite's session fixtures of the private Docker engine, and how the suite splits across pytest-xdist workers.

Docker: one private engine, its base image and the mock image per session. Each is expensive on CI's 2 cores (the mock
image carries torch and the real LMCache server), so every test shares them; the machinery lives in `dockerkit.py`.
Fixtures start only when a test asks for them: tests without the engine (such as the LMCache host build) never start
a daemon.

Workers: `scripts/test.sh` runs `pytest -n 2`. Much of the suite waits (servers starting, a sidecar held back before
its restart, an engine idling until LMCache reaps it), so two workers on two cores finish well before one. A worker
takes whole test files, so a module-scoped fixture (a real engine's pod, a source build of LMCache) is set up once, as
without workers; the files of the Docker engine's tests go to one worker together, since they share this session's
engine and images (on two, both would start an engine and build every image). Without `-n` none of this applies.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

from tests.support.dockerkit import DockerEngine, MockImageBuild, build_mock_image, import_base_image, private_engine

# The staging tests load `stagekit` as a plugin (its fixtures); its asserts are rewritten like a test module's.
pytest.register_assert_rewrite("tests.support.stagekit")
# Every run ends with the budget report (tests/support/budget.py): where its wall time went.
pytest_plugins = ["tests.support.budget"]

# The test files that use the session's Docker engine (the fixtures below), run on one worker.
ON_THE_SESSIONS_ENGINE = frozenset({"tests/images/test_mock_image.py", "tests/images/test_container_pod.py"})


# xdist's own order (scopes with the most tests first) is kept on purpose. Measured in warm CI dry runs on 2 cores
# (2026-12-03): with it, pytest took 1994 s; handing out the costliest scopes first (the real-engine main jobs, then the
# Docker engine's files) took 2415 s, because the two CPU-bound real engines (the tiny hybrid's main job and the
# container pod's) then ran side by side and each slowed the other far more than a waiting test does (967 s instead of
# 651 s, 626 s instead of 202 s): on two cores a real engine runs best beside the tests that mostly wait.
class WholeFiles(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's scope scheduling with a file as the scope, and the Docker engine's files as one scope.

    xdist's own `--dist loadgroup` cannot do this under pytest 9: xdist 3.8.0 renames the grouped tests by assigning
    `item._nodeid` (xdist/remote.py:236-254), which pytest 9.2's `Node.nodeid` no longer reads (it returns `self._id`,
    _pytest/nodes.py:290-292), so every test stays ungrouped.
    """

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return "docker-engine" if path in ON_THE_SESSIONS_ENGINE else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling:
    return WholeFiles(config, log)


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
