"""The Ansible playbooks without a Docker engine or a cluster: syntax, lint, role interfaces and preflight refusals.

`ansible-lint --profile production` is the bar the roles are held to; each role's `meta/argument_specs.yml` must
document exactly its `defaults/main.yml` (same names, same defaults), so the interface Ansible validates and the one
users read cannot drift; and each preflight refusal is one sentence that says what was expected, what was found and
what to do. Builds against a real engine (and the check-mode run) are in tests/docker/test_mock_image.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO_ROOT / "ansible"
ROLES = sorted(path.name for path in (ANSIBLE_DIR / "roles").iterdir() if path.is_dir())
PLAYBOOKS = ("build-images.yml", "deploy.yml")
NO_DAEMON = "unix:///nonexistent/glm53/docker.sock"


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


def failure_messages(playbook: str, extra_vars: dict[str, Any], **env: str) -> list[str]:
    """Run a playbook that must fail; the messages of its failed tasks, read through the JSON callback."""
    completed = subprocess.run(
        [tool("ansible-playbook"), playbook, "-e", json.dumps(extra_vars)],
        cwd=ANSIBLE_DIR,
        env=ansible_env(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", **env),
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode != 0, f"{playbook} passed with {extra_vars}"
    output = json.loads(completed.stdout[completed.stdout.index("{") :])
    tasks = (task for play in output["plays"] for task in play["tasks"])
    return [str(result["msg"]) for task in tasks for result in task["hosts"].values() if result.get("failed")]


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_syntax_check(playbook: str) -> None:
    completed = subprocess.run(
        [tool("ansible-playbook"), "--syntax-check", playbook],
        cwd=ANSIBLE_DIR,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )

    assert completed.returncode == 0, completed.stdout + completed.stderr


@pytest.mark.slow
def test_ansible_lint_production_profile() -> None:
    completed = subprocess.run(
        [tool("ansible-lint"), "--offline", "--profile", "production", "--nocolor", "-f", "pep8"],
        cwd=ANSIBLE_DIR,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=False,
    )

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
