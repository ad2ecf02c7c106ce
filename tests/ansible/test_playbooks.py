"""The Ansible playbooks without a Docker engine or a cluster: syntax, lint, role interfaces and preflight refusals.

`ansible-lint --profile production` is the bar the roles are held to; each role's `meta/argument_specs.yml` must
document exactly its `defaults/main.yml` (same names, same defaults), so the interface Ansible validates and the one
users read cannot drift; and each preflight refusal is one sentence that says what was expected, what was found and
what to do. The builder choice is read from captured `docker version` answers through a stand-in docker CLI (no
daemon); builds against a real engine (and the check-mode run) are in tests/images/test_mock_image.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chartkit import APP_VERSION

REPO_ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO_ROOT / "ansible"
ROLES = sorted(path.name for path in (ANSIBLE_DIR / "roles").iterdir() if path.is_dir())
PLAYBOOKS = ("build-images.yml", "deploy.yml")
NO_DAEMON = "unix:///nonexistent/glm53/docker.sock"
# Captured `docker version --format '{{json .}}'` answers (fixtures/docker-version/README.md says from what).
DOCKER_VERSIONS = Path(__file__).parent / "fixtures" / "docker-version"
DEBIAN_DOCKER_IO = DOCKER_VERSIONS / "docker.io-20.10.24.json"
DOCKER_CLI_28 = DOCKER_VERSIONS / "docker-cli-28.2.2.json"


def tool(name: str) -> str:
    """An Ansible executable from .tools/bin, or fail naming the setup script that installs it."""
    found = shutil.which(name, path=str(REPO_ROOT / ".tools" / "bin")) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found in .tools/bin or on PATH; run `bash scripts/setup.d/31-ansible.sh` first")
    return found


def ansible_env(**extra: str) -> dict[str, str]:
    # The venv's bin first, so ansible-lint finds the ansible-playbook of its own venv.
    venv_bin = Path(os.path.realpath(tool("ansible-playbook"))).parent
    path = os.pathsep.join([str(venv_bin), str(REPO_ROOT / ".tools" / "bin"), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), **extra}


def ansible(executable: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run an Ansible executable in the ansible directory with `ansible_env(**env)`; its output captured, any exit."""
    return subprocess.run(
        [tool(executable), *args],
        cwd=ANSIBLE_DIR,
        env=ansible_env(**env),
        capture_output=True,
        text=True,
        check=False,
    )


def failure_messages(playbook: str, extra_vars: dict[str, Any], **env: str) -> list[str]:
    """Run a playbook that must fail; the messages of its failed tasks, read through the JSON callback."""
    completed = ansible(
        "ansible-playbook", playbook, "-e", json.dumps(extra_vars), ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", **env
    )
    assert completed.returncode != 0, f"{playbook} passed with {extra_vars}"
    output = json.loads(completed.stdout[completed.stdout.index("{") :])
    tasks = (task for play in output["plays"] for task in play["tasks"])
    return [str(result["msg"]) for task in tasks for result in task["hosts"].values() if result.get("failed")]


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_syntax_check(playbook: str) -> None:
    completed = ansible("ansible-playbook", "--syntax-check", playbook)

    assert completed.returncode == 0, completed.stdout + completed.stderr


@pytest.mark.slow
def test_ansible_lint_production_profile() -> None:
    completed = ansible("ansible-lint", "--offline", "--profile", "production", "--nocolor", "-f", "pep8")

    assert completed.returncode == 0, completed.stdout + completed.stderr


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_mirror_defaults(role: str) -> None:
    defaults: dict[str, Any] = yaml.safe_load((ANSIBLE_DIR / "roles" / role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ANSIBLE_DIR / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, dict[str, Any]] = specs["argument_specs"]["main"]["options"]

    assert list(options) == list(defaults), "argument_specs must list the defaults' variables in the same order"
    assert {name: spec.get("default") for name, spec in options.items()} == defaults
    assert all(spec.get("type") and spec.get("description") for spec in options.values())
    assert all(name.startswith(f"{role}_") for name in defaults), f"every variable of {role} carries its prefix"


def test_playbooks_use_only_fully_qualified_modules() -> None:
    module_keys: set[str] = set()
    for tasks_file in (ANSIBLE_DIR / "roles").glob("*/tasks/*.yml"):
        for task in yaml.safe_load(tasks_file.read_text()) or []:
            for entry in [task, *task.get("block", [])]:
                module_keys |= {key for key in entry if "." in key}

    assert module_keys, "no module found"
    assert all(key.split(".")[0] in {"ansible", "kubernetes"} for key in module_keys), module_keys


def test_build_refuses_an_unreachable_daemon() -> None:
    messages = failure_messages("build-images.yml", {"glm53_images": ["mock"]}, DOCKER_HOST=NO_DAEMON)

    assert messages == [
        f"expected a reachable Docker daemon at DOCKER_HOST={NO_DAEMON}, found: Cannot connect to the Docker daemon "
        f"at {NO_DAEMON}. Is the docker daemon running?; start dockerd or point DOCKER_HOST at a running one"
    ]


def test_build_refuses_a_missing_docker_cli() -> None:
    messages = failure_messages("build-images.yml", {"glm53_docker_cli": "/nonexistent/docker"})

    assert messages == [
        "expected the docker CLI '/nonexistent/docker' on PATH, found none; install Docker "
        "(Debian: scripts/setup.d/30-docker-engine.sh) or set glm53_docker_cli"
    ]


def test_deploy_refuses_a_missing_helm() -> None:
    messages = failure_messages("deploy.yml", {"glm53_deploy_helm": "/nonexistent/helm"})

    assert messages == [
        "expected the helm CLI '/nonexistent/helm' on PATH, found none; install Helm 3 "
        "(scripts/setup.d/20-helm.sh puts one in .tools/bin) or set glm53_deploy_helm"
    ]


def test_deploy_refuses_an_unknown_profile() -> None:
    (message,) = failure_messages("deploy.yml", {"glm53_deploy_profile": "glm53-max"})

    assert "value of glm53_deploy_profile must be one of: glm53-flash, glm53, got: glm53-max" in message


# ---- the builder choice, through a stand-in docker CLI ---------------------------------------------------------------


def fake_docker(directory: Path, version_answer: Path, *, buildx: bool = False) -> Path:
    """A docker CLI that answers `version` with a captured answer and `buildx version` as the plugin's presence says,
    records each `build` with the DOCKER_BUILDKIT it ran under in `builds.log`, and runs every image successfully."""
    script, log = directory / "docker", shlex.quote(str(directory / "builds.log"))
    absent = "echo 'docker: unknown command: docker buildx' >&2; exit 1"
    buildx_answer = "echo 'github.com/docker/buildx v0.17.1'" if buildx else absent
    image_id = "sha256:" + "0" * 64
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  version) cat {shlex.quote(str(version_answer))} ;;\n"
        f"  buildx) {buildx_answer} ;;\n"
        "  image) echo '[]'; echo 'Error: No such image' >&2; exit 1 ;;\n"
        f'  build) echo "DOCKER_BUILDKIT=${{DOCKER_BUILDKIT-unset}} $*" >> {log}; echo {image_id} ;;\n'
        "  run) ;;\n"
        '  *) echo "fake docker: unexpected $*" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return script


def serving_build_vars(docker: Path, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """The serving image alone through `docker`, no disk check (the stand-in has no data root), report in tmp_path."""
    return {
        "glm53_docker_cli": str(docker),
        "glm53_docker_check_disk": False,
        "glm53_images": ["serving"],
        "glm53_images_report": str(tmp_path / "report.json"),
        **extra,
    }


def the_one_build(extra_vars: dict[str, Any], tmp_path: Path) -> str:
    """Run build-images.yml, which must pass, through the fake docker of `tmp_path`; the one `build` it recorded."""
    completed = ansible("ansible-playbook", "build-images.yml", "-e", json.dumps(extra_vars))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr
    (build,) = (tmp_path / "builds.log").read_text().splitlines()
    return build


def variant(tmp_path: Path, answer: Path, **server: str) -> Path:
    """A captured answer with some Server fields replaced (a daemon we cannot run here)."""
    data = json.loads(answer.read_text())
    data["Server"].update(server)
    changed = tmp_path / f"variant-{answer.name}"
    changed.write_text(json.dumps(data))
    return changed


@pytest.mark.parametrize(
    ("answer", "buildx", "reason"),
    [
        # Debian's docker.io: no buildx, yet its 20.10 CLI drives the daemon's own BuildKit (measured: RUN --mount ran).
        (DEBIAN_DOCKER_IO, False, "built-in client"),
        (DOCKER_CLI_28, True, "buildx plugin"),
    ],
    ids=["debian-docker.io-20.10", "cli-28-with-buildx"],
)
def test_the_serving_image_builds_with_buildkit(answer: Path, buildx: bool, reason: str, tmp_path: Path) -> None:
    build = the_one_build(serving_build_vars(fake_docker(tmp_path, answer, buildx=buildx), tmp_path), tmp_path)

    assert json.loads((tmp_path / "report.json").read_text())["builder"] == "buildkit", reason
    dockerfile = REPO_ROOT / "docker" / "vllm-lmcache" / "Dockerfile"
    assert build.startswith(f"DOCKER_BUILDKIT=1 build --quiet --file {dockerfile} "), build


@pytest.mark.parametrize(
    ("generation", "tag_suffix"), [("0.5.6", ""), ("0.5.7rc2", "-lmcache0.5.7rc2")], ids=["default", "negotiating"]
)
def test_the_lmcache_generation_is_the_serving_builds_source_and_its_tag(
    generation: str, tag_suffix: str, tmp_path: Path
) -> None:
    """One value, the chart's lmcache.generation: LMCACHE_SOURCE of the build and, when not the default, the tag the
    chart's default image then names (charts/glm53/templates/_helpers.tpl, glm53.servingImageTag)."""
    docker = fake_docker(tmp_path, DEBIAN_DOCKER_IO)
    build = the_one_build(serving_build_vars(docker, tmp_path, glm53_images_lmcache_generation=generation), tmp_path)
    assert f"--build-arg=LMCACHE_SOURCE={generation} " in build, build
    assert f"--tag=glm53/vllm-lmcache:{APP_VERSION}{tag_suffix} " in build, build


def test_the_vllm_generation_is_the_serving_builds_vllm_version_and_its_tag(tmp_path: Path) -> None:
    """The default 0.33.0 builds with VLLM_VERSION=0.33.0 under the default tag; the chart's vllm.generation names the
    same tag (templates/_helpers.tpl, glm53.servingImageTag)."""
    docker = fake_docker(tmp_path, DEBIAN_DOCKER_IO)
    build = the_one_build(serving_build_vars(docker, tmp_path), tmp_path)
    assert "--build-arg=VLLM_VERSION=0.33.0 " in build, build
    assert f"--tag=glm53/vllm-lmcache:{APP_VERSION} " in build, build


def test_a_vllm_034_serving_build_is_refused_in_one_sentence_before_building(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path, DEBIAN_DOCKER_IO)
    messages = failure_messages(
        "build-images.yml", serving_build_vars(docker, tmp_path, glm53_images_vllm_generation="0.34.0")
    )
    assert messages == [
        "expected glm53_images_vllm_generation=0.33.0 for the serving image, found 0.34.0: "
        "docker/vllm-lmcache/Dockerfile installs vLLM under the 0.33.0 joint set (constraints.txt) only, and vLLM "
        "0.34.0 pins flashinfer-python==0.7.3, which this project's package index lacks (docs/operations.md, "
        '"Upgrading the engine to vLLM 0.34"); build with glm53_images_vllm_generation=0.33.0 or leave serving out '
        "of the image selection"
    ]
    assert not (tmp_path / "builds.log").exists()


def test_an_unknown_lmcache_generation_is_refused_before_building(tmp_path: Path) -> None:
    """The role's argument spec lists the chart's generations (meta/argument_specs.yml, `choices`)."""
    docker = fake_docker(tmp_path, DEBIAN_DOCKER_IO)
    messages = failure_messages(
        "build-images.yml", serving_build_vars(docker, tmp_path, glm53_images_lmcache_generation="0.5.7")
    )
    assert messages == [
        "Validation of arguments failed:\n"
        "value of glm53_images_lmcache_generation must be one of: 0.5.6, 0.5.7rc2, got: 0.5.7"
    ]
    assert not (tmp_path / "builds.log").exists()


REFUSE_SERVING = "expected BuildKit for serving (its Dockerfile uses RUN --mount), found the legacy builder: "
CLI_28_WITHOUT_BUILDX = "docker CLI 28.2.2 without the buildx plugin, which BuildKit builds need from Docker 23 on"


def test_a_cli_from_docker_23_on_without_buildx_refuses_the_serving_image(tmp_path: Path) -> None:
    # From 23.0 `DOCKER_BUILDKIT=1 docker build` is `docker buildx build`: measured failing without the plugin.
    messages = failure_messages("build-images.yml", serving_build_vars(fake_docker(tmp_path, DOCKER_CLI_28), tmp_path))

    assert messages == [
        f"{REFUSE_SERVING}{CLI_28_WITHOUT_BUILDX}; install docker-buildx or leave serving out of the image selection"
    ]
    assert not (tmp_path / "builds.log").exists()


def test_a_daemon_without_buildkit_refuses_the_serving_image(tmp_path: Path) -> None:
    answer = variant(tmp_path, DEBIAN_DOCKER_IO, Os="windows", ApiVersion="1.38")

    messages = failure_messages("build-images.yml", serving_build_vars(fake_docker(tmp_path, answer), tmp_path))

    assert messages == [
        f"{REFUSE_SERVING}a windows daemon at API 1.38, where BuildKit needs a Linux daemon at API 1.39 (Docker 18.09) "
        "or later; install docker-buildx or leave serving out of the image selection"
    ]


def test_a_forced_legacy_builder_refuses_the_serving_image(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path, DEBIAN_DOCKER_IO)

    messages = failure_messages("build-images.yml", serving_build_vars(docker, tmp_path, glm53_docker_builder="legacy"))

    assert messages == [
        f"{REFUSE_SERVING}glm53_docker_builder is legacy; set glm53_docker_builder to auto "
        "or leave serving out of the image selection"
    ]


def test_forcing_buildkit_where_the_cli_cannot_refuses_in_one_sentence(tmp_path: Path) -> None:
    forced = serving_build_vars(fake_docker(tmp_path, DOCKER_CLI_28), tmp_path, glm53_docker_builder="buildkit")

    messages = failure_messages("build-images.yml", forced)

    assert messages == [
        "expected a docker CLI and daemon that build with BuildKit because glm53_docker_builder is 'buildkit', found "
        f"{CLI_28_WITHOUT_BUILDX}; install docker-buildx or set glm53_docker_builder to auto or legacy"
    ]
