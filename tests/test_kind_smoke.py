"""The kind smoke test, tested as far as a machine without Docker registry or Kubernetes honestly allows.

CI has neither, so: shellcheck of the entry point and its hand-off to `glm53 kind-smoke`; the dry run, which prints the
very plan a real run executes, asserted in detail for both profiles and for --reuse/--keep; the planned install command
rendered by the real chart; whole runs driven by tiny fake `docker`/`kind`/`kubectl`/`ansible-playbook`/`helm` scripts
on a temporary PATH and, past the install, by a fake Kubernetes API server on loopback (exit codes 10 to 14, the
artifacts, and the teardown each path does or must not do); the readiness, geometry and artifact logic fed with pods,
events and logs as the Kubernetes API returns them; and the operations guide checked against the profiles.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from glm53 import kind_smoke as ks
from glm53.cli import main as cli_main
from glm53.commands import kind_smoke as kind_smoke_cmd
from glm53.commands.kind_smoke import PodWatch
from glm53.logparse import parse_lines
from glm53.profiles import get_profile

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "kind-smoke.sh"
NODE_IMAGE = ks.NODE_IMAGE
# The image the playbook tags with the toolkit version, side-loaded (never pulled), and no weights volume claim.
IMAGE_SETS = (
    "--set mock.image.repository=glm53/mock --set mock.image.tag=0.1.0 --set mock.image.pullPolicy=Never "
    "--set weights.source=none --namespace glm53-smoke --create-namespace --kube-context kind-glm53-smoke"
)
FLASH_HELM = f"helm install glm53-flash charts/glm53 --set mock.enabled=true --set validation.enabled=true {IMAGE_SETS}"
GLM53_HELM = (
    f"helm install glm53 charts/glm53 --set mock.enabled=true --set validation.enabled=true --set profile=glm53 "
    f"{IMAGE_SETS}"
)
BUILD = (
    """ANSIBLE_CONFIG=ansible/ansible.cfg ansible-playbook ansible/build-images.yml -e '{"glm53_images": ["mock"]}'"""
)
# The same call as a fake tool logs it: arguments joined by spaces, without the shell's quoting.
BUILD_LOGGED = (
    """ANSIBLE_CONFIG=ansible/ansible.cfg ansible-playbook ansible/build-images.yml -e {"glm53_images": ["mock"]}"""
)
KIND_DELETE = "kind delete cluster --name glm53-smoke"


def _tool(name: str, setup: str) -> str:
    """A tool from PATH or .tools/bin; missing fails (CI runs the setup scripts first) naming the script to run."""
    found = shutil.which(name) or shutil.which(name, path=str(REPO / ".tools" / "bin"))
    if found is None:
        pytest.fail(f"{name} not found on PATH or in .tools/bin; run `bash scripts/setup.d/{setup}` first")
    return found


def test_entry_point_is_shellcheck_clean() -> None:
    done = subprocess.run(
        [_tool("shellcheck", "32-lint-tools.sh"), "--severity=style", str(SCRIPT)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_entry_point_bootstraps_then_hands_every_argument_to_glm53(tmp_path: Path) -> None:
    # A copy of the script in a fake repository: its bootstrap and its glm53 record what they were given, so the test
    # never installs anything into the real virtual environment.
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts" / "kind-smoke.sh")
    record = tmp_path / "record.txt"
    (tmp_path / "scripts" / "bootstrap.sh").write_text(f'echo "bootstrap $*" >> {record}\n')
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "glm53").write_text(f'#!/bin/sh\necho "glm53 $* (cwd $(pwd))" >> {record}\n')
    (venv_bin / "glm53").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GLM53_VENV"}
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "kind-smoke.sh"), "--profile", "glm53", "--dry-run", "--name", "a b"],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert record.read_text().splitlines() == [
        "bootstrap dev",
        f"glm53 kind-smoke --profile glm53 --dry-run --name a b (cwd {tmp_path})",
    ]


# ---------------------------------------------------------------------------------------------------------- dry run


def dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert cli_main(["kind-smoke", "--dry-run", *args]) == 0
    return capsys.readouterr().out.splitlines()


def commands(lines: list[str]) -> list[str]:
    """The indented lines of the dry run: the commands and steps, without the phase headers."""
    return [line.strip() for line in lines if line.startswith("    ")]


def test_dry_run_flash_prints_every_step_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    lines = dry_run(capsys)
    headers = [line for line in lines if line.startswith("[")]
    assert headers == [
        "[1] preflight (exit 10 on failure)",
        "[2] cluster (exit 11 on failure)",
        "[3] image (exit 11 on failure)",
        "[4] image (exit 11 on failure)",
        "[5] install (exit 12 on failure)",
        "[6] ready (exit 13 on failure)",
        "[7] ready (exit 13 on failure)",
        "[8] helm-test (exit 14 on failure)",
        "[9] validate (exit 14 on failure)",
    ]
    steps = commands(lines)
    assert steps[:6] == [
        "docker --version  # need docker >= 20.10.0",
        "kind version  # need kind >= 0.33.0",
        "kubectl version --client  # need kubectl >= 1.33.0",
        "ansible-playbook --version  # need ansible-playbook >= 2.19.0",
        "helm version --short  # need helm >= 3.10.0",
        "docker info --format '{{.ServerVersion}}'  # the daemon must be reachable",
    ]
    assert f"# node image {NODE_IMAGE} must be Kubernetes >= 1.29.0" in steps
    create = f"kind create cluster --name glm53-smoke --image {NODE_IMAGE} --wait 120s"
    expected_in_order = [
        "kind get clusters",
        f"{create}  # fails first if `kind get clusters` already lists 'glm53-smoke' (pass --reuse to keep it)",
        "kind export kubeconfig --name glm53-smoke",
        BUILD,
        "kind load docker-image glm53/mock:0.1.0 --name glm53-smoke",
        FLASH_HELM,
        "helm test glm53-flash --logs --timeout 10m --kube-context kind-glm53-smoke --namespace glm53-smoke",
        "kubectl --context kind-glm53-smoke --namespace glm53-smoke port-forward --address 127.0.0.1 "
        "service/glm53-flash 18000:8000 &",
        "glm53 validate --base-url http://127.0.0.1:18000 --profile glm53-flash",
        "# stop the port-forward",
        KIND_DELETE,
    ]
    positions = [steps.index(line) for line in expected_in_order]
    assert positions == sorted(positions)
    wait = next(line for line in steps if line.startswith("# watch pods"))
    assert "-l app.kubernetes.io/instance=glm53-flash,app.kubernetes.io/component=engine in glm53-smoke" in wait
    assert "milestones: scheduled, sidecar lmcache started, vllm running, startup probe passed, Ready" in wait
    geometry = next(line for line in steps if "parsed geometry" in line)
    assert "group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0] at TP 4" in geometry
    assert "on failure: collect describe, events and the logs of every container into artifacts/kind-smoke/" in lines
    assert lines[-2:] == ["teardown (always, also after a failure):", f"    {KIND_DELETE}"]


def test_dry_run_glm53_installs_the_tp8_profile_under_its_own_release(capsys: pytest.CaptureFixture[str]) -> None:
    steps = commands(dry_run(capsys, "--profile", "glm53"))
    assert GLM53_HELM in steps
    assert FLASH_HELM not in steps
    assert "helm test glm53 --logs --timeout 10m --kube-context kind-glm53-smoke --namespace glm53-smoke" in steps
    assert "glm53 validate --base-url http://127.0.0.1:18000 --profile glm53" in steps
    assert any("service/glm53 18000:8000" in line for line in steps)
    assert any("(expected for glm53: group_tokens_per_block=[64] at TP 8)" in line for line in steps)
    assert steps[-1] == KIND_DELETE


def test_dry_run_real_engine_installs_the_tiny_profile_with_the_images_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    steps = commands(dry_run(capsys, "--engine", "vllm"))
    (install,) = [step for step in steps if step.startswith("helm install ")]
    assert install.startswith("helm install glm53-tiny-dense charts/glm53 --set mock.enabled=true")
    assert "--set profile=tiny-dense --set mock.engine=vllm" in install
    assert "glm53 validate --base-url http://127.0.0.1:18000 --profile tiny-dense" in steps
    assert any("(expected for tiny-dense: group_tokens_per_block=[64] at TP 1)" in line for line in steps)


def test_dry_run_reuse_keeps_the_cluster_and_uninstalls_only_the_release(capsys: pytest.CaptureFixture[str]) -> None:
    lines = dry_run(capsys, "--reuse", "--name", "dev")
    steps = commands(lines)
    assert (
        f"kind create cluster --name dev --image {NODE_IMAGE} --wait 120s  "
        "# only if `kind get clusters` does not list 'dev' (--reuse keeps an existing one)"
    ) in steps
    assert "kind load docker-image glm53/mock:0.1.0 --name dev" in steps
    assert not any(line.startswith("kind delete") for line in steps)
    assert lines[-2:] == [
        "teardown (always, also after a failure):",
        "    helm uninstall glm53-flash --wait --kube-context kind-dev --namespace glm53-smoke  "
        "# only if the install step ran",
    ]


@pytest.mark.parametrize("extra", [[], ["--reuse"]])
def test_dry_run_keep_tears_nothing_down(capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    lines = dry_run(capsys, "--keep", *extra)
    assert lines[-1] == "teardown: skipped (--keep)"
    assert not any("kind delete" in line or "helm uninstall" in line for line in lines)
    assert FLASH_HELM in commands(lines)


def test_dry_run_options_reach_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    steps = commands(
        dry_run(
            capsys,
            *("--namespace", "ns1", "--local-port", "19001", "--timeout", "90", "--artifacts", "/tmp/out"),
        )
    )
    assert any(line.startswith("helm install") and "--namespace ns1 --create-namespace" in line for line in steps)
    assert "helm test glm53-flash --logs --timeout 10m --kube-context kind-glm53-smoke --namespace ns1" in steps
    assert "glm53 validate --base-url http://127.0.0.1:19001 --profile glm53-flash" in steps
    assert any(line.startswith("# watch pods") and "timeout 90s" in line for line in steps)


def test_dry_run_needs_no_tool_at_all(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "glm53", "kind-smoke", "--dry-run", "--profile", "glm53"],
        env={"PATH": str(tmp_path), "HOME": str(tmp_path)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert GLM53_HELM in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--local-port", "0"], "--local-port must be a TCP port 1-65535, got 0; pick a free local port"),
        (
            ["--timeout", "-1"],
            "--timeout must be positive seconds, got -1; pass the seconds the pod may take to become Ready",
        ),
    ],
)
def test_bad_options_are_one_line_usage_errors(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert cli_main(["kind-smoke", "--dry-run", *args]) == 2
    assert capsys.readouterr().err == f"glm53 kind-smoke: error: {message}\n"


# ---------------------------------------------------------------------------------------------- fake tools on PATH

NEW_TOOLS: dict[str, dict[str, tuple[str, int]]] = {
    "docker": {"--version": ("Docker version 28.2.2, build e6534b4", 0), "info": ("28.2.2", 0)},
    "kind": {"version": ("kind v0.33.0 go1.25.1 linux/amd64", 0)},
    "kubectl": {"version": ("Client Version: v1.34.2\nKustomize Version: v5.7.1", 0)},
    "ansible-playbook": {"--version": ("ansible-playbook [core 2.19.14]\n  config file = None", 0)},
    "helm": {"version": ("v3.19.0+g3d8990f", 0)},
}


def fake_tool(bin_dir: Path, log: Path, name: str, responses: Mapping[str, tuple[str, int]]) -> None:
    """A shell script that logs its arguments and answers by its first argument (default: silent success)."""
    cases = "".join(
        f"  {first})\n    printf '%s\\n' '{out}'\n    exit {status} ;;\n" for first, (out, status) in responses.items()
    )
    script = f'#!/bin/sh\necho "{name} $*" >> {log}\ncase "$1" in\n{cases}esac\nexit 0\n'
    path = bin_dir / name
    path.write_text(script)
    path.chmod(0o755)


def free_port() -> int:
    """A loopback port nobody holds right now."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])


class FakeMachine:
    """A temporary repository root and PATH holding only fake tools, each logging its calls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        self.log = root / "calls.log"
        self.log.touch()
        (root / "charts" / "glm53").mkdir(parents=True)
        (root / "ansible").mkdir()
        (root / "ansible" / "build-images.yml").write_text("---\n")
        for name, responses in NEW_TOOLS.items():
            fake_tool(self.bin, self.log, name, responses)

    def tool(self, name: str, responses: Mapping[str, tuple[str, int]]) -> None:
        fake_tool(self.bin, self.log, name, responses)

    def run(self, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "glm53", "kind-smoke", "--local-port", str(free_port()), *args],
            env={"PATH": str(self.bin), "HOME": str(self.root), **(env or {})},
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def machine(tmp_path: Path) -> FakeMachine:
    return FakeMachine(tmp_path)


def test_preflight_passes_with_new_enough_tools(machine: FakeMachine) -> None:
    done = machine.run("--preflight-only")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "kind-smoke: preflight: docker 28.2.2 ok (>= 20.10.0)",
        "kind-smoke: preflight: docker daemon 28.2.2 reachable",
        "kind-smoke: preflight: kind 0.33.0 ok (>= 0.33.0)",
        "kind-smoke: preflight: kubectl 1.34.2 ok (>= 1.33.0)",
        "kind-smoke: preflight: ansible-playbook 2.19.14 ok (>= 2.19.0)",
        "kind-smoke: preflight: helm 3.19.0 ok (>= 3.10.0)",
        f"kind-smoke: preflight: node image {NODE_IMAGE} (Kubernetes 1.34.11) ok (>= 1.29.0)",
        "kind-smoke: preflight passed",
    ]
    assert done.stderr == ""
    assert machine.calls() == [
        "docker --version",
        "docker info --format {{.ServerVersion}}",
        "kind version",
        "kubectl version --client",
        "ansible-playbook --version",
        "helm version --short",
    ]


def test_preflight_names_each_missing_or_old_tool_in_one_line_and_exits_10(machine: FakeMachine) -> None:
    machine.tool("kind", {"version": ("kind v0.20.0 go1.20.4 linux/amd64", 0)})
    machine.tool("kubectl", {"version": ("Client Version: v1.27.3\nKustomize Version: v5.0.1", 0)})
    (machine.bin / "helm").unlink()
    done = machine.run("--preflight-only")
    assert done.returncode == 10
    assert done.stderr.splitlines() == [
        "kind-smoke: preflight: kind 0.20.0 is too old; need >= 0.33.0 because the pinned node image is built for "
        "kind v0.33.0 (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)",
        "kind-smoke: preflight: kubectl 1.27.3 is too old; need >= 1.33.0 because kubectl must be within 1 minor "
        "version of the node's Kubernetes 1.34.11 (https://kubernetes.io/docs/tasks/tools/)",
        "kind-smoke: preflight: helm not found on PATH; install helm >= 3.10.0 (https://helm.sh/docs/intro/install/)",
        "glm53 kind-smoke: error: preflight failed: 3 problem(s), listed above; fix them and rerun",
    ]


def test_preflight_reports_old_docker_and_unreadable_versions(machine: FakeMachine) -> None:
    machine.tool("docker", {"--version": ("Docker version 19.03.15, build 99e3ed8", 0)})
    machine.tool("helm", {"version": ("helm: command crashed", 1)})
    done = machine.run("--preflight-only")
    assert done.returncode == 10
    assert done.stderr.splitlines()[:2] == [
        "kind-smoke: preflight: docker 19.3.15 is too old; need >= 20.10.0 because kind's node containers need a "
        "cgroup v2-aware Docker Engine (https://docs.docker.com/engine/install/)",
        "kind-smoke: preflight: could not read helm's version from `helm version --short` "
        "(got 'helm: command crashed'); install helm >= 3.10.0 (https://helm.sh/docs/intro/install/)",
    ]
    assert "docker info --format {{.ServerVersion}}" not in machine.calls()  # no daemon check behind an old client


def test_preflight_reports_an_unreachable_docker_daemon(machine: FakeMachine) -> None:
    machine.tool(
        "docker",
        {
            "--version": ("Docker version 28.2.2, build e6534b4", 0),
            "info": ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", 1),
        },
    )
    done = machine.run("--preflight-only")
    assert done.returncode == 10
    assert done.stderr.splitlines() == [
        "kind-smoke: preflight: docker is installed but its daemon is not reachable (`docker info` said: Cannot "
        "connect to the Docker daemon at unix:///var/run/docker.sock.); start Docker or give this user access to "
        "its socket",
        "glm53 kind-smoke: error: preflight failed: 1 problem(s), listed above; fix them and rerun",
    ]


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (
            "kindest/node:v1.28.15@sha256:a7c05c7ae043a0b8c818f5a06188bc2c4098f6cb59ca7d1856df00375d839251",
            f"node image Kubernetes 1.28.15 is too old; need >= 1.29.0 for native sidecars (default {NODE_IMAGE})",
        ),
        (
            "kindest/node:v1.34.11",
            "node image 'kindest/node:v1.34.11' is not a digest-pinned kindest/node:vX.Y.Z@sha256:<digest> reference; "
            f"pick one from your kind release's notes (default {NODE_IMAGE})",
        ),
    ],
)
def test_preflight_refuses_an_old_or_unpinned_node_image(machine: FakeMachine, image: str, message: str) -> None:
    done = machine.run("--preflight-only", "--node-image", image)
    assert done.returncode == 10
    assert f"kind-smoke: preflight: {message}" in done.stderr.splitlines()


def test_preflight_refuses_a_busy_port_and_a_wrong_working_directory(machine: FakeMachine) -> None:
    shutil.rmtree(machine.root / "charts")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = machine.run("--preflight-only", "--local-port", str(port))
    assert done.returncode == 10
    assert done.stderr.splitlines()[:2] == [
        f"kind-smoke: preflight: charts/glm53 not found under {machine.root}; run from the repository root "
        "(the script does)",
        f"kind-smoke: preflight: local port {port} is in use; pass --local-port with a free port",
    ]


def test_existing_cluster_without_reuse_exits_11_and_is_never_deleted(machine: FakeMachine) -> None:
    machine.tool("kind", {"version": ("kind v0.33.0 go1.25.1 linux/amd64", 0), "get": ("glm53-smoke", 0)})
    done = machine.run()
    assert done.returncode == 11
    assert done.stderr.splitlines()[-1] == (
        "glm53 kind-smoke: error: cluster failed: a kind cluster named 'glm53-smoke' already exists; pass --reuse to "
        "use it, or --name for another one"
    )
    assert not any(call.startswith(("kind create", "kind delete")) for call in machine.calls())


def test_failed_install_exits_12_and_still_tears_down(machine: FakeMachine) -> None:
    machine.tool("helm", {"version": ("v3.19.0+g3d8990f", 0), "install": ("Error: INSTALLATION FAILED", 1)})
    playbook = machine.bin / "ansible-playbook"
    playbook.write_text(
        f'#!/bin/sh\necho "ANSIBLE_CONFIG=$ANSIBLE_CONFIG ansible-playbook $*" >> {machine.log}\n'
        'if [ "$1" = --version ]; then echo "ansible-playbook [core 2.19.14]"; fi\n'
    )
    done = machine.run()
    assert done.returncode == 12, done.stderr
    calls = machine.calls()
    create = f"kind create cluster --name glm53-smoke --image {NODE_IMAGE} --wait 120s"
    sequence = [
        "kind get clusters",
        create,
        "kind export kubeconfig --name glm53-smoke",
        BUILD_LOGGED,
        "kind load docker-image glm53/mock:0.1.0 --name glm53-smoke",
        FLASH_HELM,
        KIND_DELETE,
    ]
    assert calls[calls.index("kind get clusters") :] == sequence
    stderr = done.stderr.splitlines()
    assert stderr[-1].startswith("glm53 kind-smoke: error: install failed: `helm install glm53-flash charts/glm53")
    assert stderr[-1].endswith("` exited with status 1")
    # No kubeconfig in this fake HOME: the artifact collection says so instead of hiding the install failure.
    assert any(line.startswith("kind-smoke: could not collect artifacts:") for line in stderr)


UNINSTALL = "helm uninstall glm53-flash --wait --kube-context kind-glm53-smoke --namespace glm53-smoke"


@pytest.mark.parametrize(
    ("failing", "status", "uninstalled"),
    [
        # The build fails before anything was installed: nothing to uninstall, and the cluster stays.
        ("ansible-playbook", 11, False),
        # The install fails: the (partial) release is uninstalled, the cluster stays.
        ("helm", 12, True),
    ],
)
def test_a_reused_cluster_is_kept_and_only_an_installed_release_removed(
    machine: FakeMachine, failing: str, status: int, uninstalled: bool
) -> None:
    machine.tool("kind", {"version": ("kind v0.33.0 go1.25.1 linux/amd64", 0), "get": ("other\nglm53-smoke", 0)})
    first_argument = {"ansible-playbook": "ansible/build-images.yml", "helm": "install"}[failing]
    machine.tool(failing, {**NEW_TOOLS[failing], first_argument: ("it broke", 2)})
    done = machine.run("--reuse")
    assert done.returncode == status, done.stderr
    calls = machine.calls()
    assert not any(call.startswith(("kind create", "kind delete")) for call in calls)
    assert (UNINSTALL in calls) is uninstalled
    assert "kind-smoke: cluster: reusing kind cluster 'glm53-smoke'" in done.stdout
    assert done.stderr.splitlines()[-1].endswith("` exited with status 2")


# ------------------------------------------------------------------------------------------------ pure judgements


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("Docker version 28.2.2, build e6534b4", (28, 2, 2)),
        ("kind v0.33.0 go1.25.1 linux/amd64", (0, 33, 0)),
        ("kind version v0.31.0 (default image kindest/node:v1.35.0@sha256:452d)", (0, 31, 0)),
        ("Client Version: v1.32.4-dispatcher\nKustomize Version: v5.5.0", (1, 32, 4)),
        ('Client Version: version.Info{Major:"1", Minor:"27", GitVersion:"v1.27.3"}', (1, 27, 3)),
        ("v3.10.1+g9f88ccb", (3, 10, 1)),
        ("v4.0", (4, 0, 0)),
        ("no digits here", None),
    ],
)
def test_versions_are_read_from_real_tool_outputs(output: str, version: ks.Version | None) -> None:
    assert ks.parse_version(output) == version


def test_kubectl_minimum_follows_the_node_image() -> None:
    by_name = {r.name: r for r in ks.tool_requirements()}
    assert by_name["kubectl"].minimum == (1, 33, 0)
    newer = "kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5"
    assert {r.name: r for r in ks.tool_requirements(newer)}["kubectl"].minimum == (1, 36, 0)
    assert ks.node_image_kubernetes(NODE_IMAGE) == (1, 34, 11)


def pod(
    name: str = "glm53-flash-7d9f-abcde",
    conditions: Mapping[str, str] | None = None,
    sidecar: Mapping[str, Any] | None = None,
    engine: Mapping[str, Any] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    """A pod as the API returns it (camelCase), with the chart's two containers."""
    return {
        "metadata": {"name": name, "namespace": "glm53-smoke", "labels": {ks.INSTANCE_LABEL: "glm53-flash"}},
        "spec": {
            "nodeName": "glm53-smoke-control-plane",
            "initContainers": [{"name": "lmcache", "image": "glm53/mock:kind-smoke", "restartPolicy": "Always"}],
            "containers": [
                {"name": "vllm", "image": "glm53/mock:kind-smoke", "startupProbe": {"exec": {"command": ["glm53"]}}}
            ],
        },
        "status": {
            "phase": phase,
            "conditions": [{"type": k, "status": v} for k, v in (conditions or {}).items()],
            "initContainerStatuses": [{"name": "lmcache", "restartCount": 0, **(sidecar or {})}],
            "containerStatuses": [{"name": "vllm", "restartCount": 0, **(engine or {})}],
        },
    }


RUNNING = {"state": {"running": {"startedAt": "2026-11-29T07:00:05Z"}}}


def test_readiness_prints_each_milestone_once_with_its_duration() -> None:
    tracker = ks.ReadinessTracker(start=100.0)
    snapshots = [
        (101.5, pod(conditions={"PodScheduled": "True"})),
        (104.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True, **RUNNING})),
        (104.5, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True, **RUNNING})),
        (105.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True}, engine=RUNNING)),
        (
            112.0,
            pod(
                conditions={"PodScheduled": "True", "Ready": "True"},
                sidecar={"started": True},
                engine={"started": True, **RUNNING},
                phase="Running",
            ),
        ),
    ]
    lines = []
    for now, snapshot in snapshots:
        assert not tracker.ready()
        lines += tracker.observe(snapshot, now)
    assert tracker.ready()
    assert lines == [
        "glm53-flash-7d9f-abcde: scheduled (+1.5s, 1.5s total)",
        "glm53-flash-7d9f-abcde: sidecar lmcache started (+2.5s, 4.0s total)",
        "glm53-flash-7d9f-abcde: vllm running (+1.0s, 5.0s total)",
        "glm53-flash-7d9f-abcde: startup probe passed (+7.0s, 12.0s total)",
        "glm53-flash-7d9f-abcde: Ready (+0.0s, 12.0s total)",
    ]


def test_stuck_and_restarted_containers_fail_at_once() -> None:
    pulling = pod(sidecar={"state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}})
    assert ks.pod_failure(pulling) == (
        "container lmcache of pod glm53-flash-7d9f-abcde is stuck in ErrImageNeverPull: image not present"
    )
    restarted = pod(engine={"restartCount": 1, "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}})
    assert ks.pod_failure(restarted) == (
        "container vllm of pod glm53-flash-7d9f-abcde restarted 1 time(s) (last exit code 137, reason Error); "
        "a failed startup probe restarts the engine"
    )
    assert ks.pod_failure(pod(engine={"state": {"waiting": {"reason": "ContainerCreating"}}})) is None


def test_pending_summary_names_what_is_missing_and_why() -> None:
    unschedulable = pod()
    unschedulable["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}
    ]
    assert ks.pending_summary(unschedulable) == (
        "pod glm53-flash-7d9f-abcde reached [nothing], not [scheduled, sidecar lmcache started, vllm running, "
        "startup probe passed, Ready] (Unschedulable: 0/1 nodes are available)"
    )


def test_only_the_pod_with_the_engine_is_the_serving_pod() -> None:
    test_pod = {"spec": {"containers": [{"name": "validate"}]}}
    assert ks.is_serving_pod(pod())
    assert not ks.is_serving_pod(test_pod)


def example_log(scenario: str) -> list[str]:
    """A GLM-5.3-Flash example pod log (engine then server), generated by the released packages' logging code."""
    folder = REPO / "examples" / "logs" / "glm53-flash" / scenario
    return [line for name in ("vllm.log", "lmcache.log") for line in (folder / name).read_text().splitlines()]


def test_geometry_is_shown_once_per_fact_and_compared_with_the_profile() -> None:
    flash, healthy = get_profile("glm53-flash"), list(parse_lines(example_log("healthy")))
    geometry = "geometry: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152"
    assert ks.geometry_lines(healthy, flash) == ["unified block size N = 1152 tokens", f"{geometry} (as expected)"]
    assert ks.geometry_lines(healthy, get_profile("glm53")) == [
        "unified block size N = 1152 tokens",
        f"{geometry} (expected [64])",
    ]
    assert ks.geometry_lines(parse_lines(example_log("wrong-chunk")), flash)[2:] == [
        "problem: vLLM's engine died (EngineCore failed to start)",
        "problem: the connector refused chunk size 256 (must be a multiple of 1152)",
        "problem: vLLM's engine died (Engine core initialization failed)",
    ]
    assert "problem: vLLM cannot reach the LMCache server at tcp://localhost:5555" in ks.geometry_lines(
        parse_lines(example_log("sidecar-unreachable")), flash
    )
    assert ks.geometry_lines([], flash) == ["geometry: no geometry line in the engine's log yet"]


# ------------------------------------------------------------------------------------------------------ artifacts


class FakeReader:
    """`ClusterReader` over canned data; a log it lacks fails like the API does for a never-started container."""

    def __init__(self, pods: list[dict[str, Any]], events: list[dict[str, Any]], logs: Mapping[str, str]) -> None:
        self._pods, self._events, self._logs = pods, events, logs
        self.asked: list[str] = []

    def pods(self, namespace: str) -> list[ks.KubeObject]:
        return list(self._pods)

    def events(self, namespace: str) -> list[ks.KubeObject]:
        return list(self._events)

    def log(self, namespace: str, pod: str, container: str, previous: bool) -> str:
        key = f"{pod}/{container}{'/previous' if previous else ''}"
        self.asked.append(key)
        if key not in self._logs:
            raise RuntimeError(f'(400) Bad Request: container "{container}" in pod "{pod}" is waiting to start')
        return self._logs[key]


def event(time: str, reason: str, name: str, message: str, kind: str = "Warning") -> dict[str, Any]:
    return {
        "lastTimestamp": time,
        "type": kind,
        "reason": reason,
        "count": 3,
        "involvedObject": {"kind": "Pod", "name": name},
        "message": message,
    }


def test_artifacts_hold_describe_events_and_every_container_log() -> None:
    serving = pod(
        sidecar={"started": True, **RUNNING},
        engine={"restartCount": 2, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}},
    )
    tester = {
        "metadata": {"name": "glm53-flash-validate", "namespace": "glm53-smoke"},
        "spec": {"containers": [{"name": "validate", "image": "glm53/mock:kind-smoke"}]},
        "status": {"phase": "Pending"},
    }
    events = [
        event("2026-11-29T07:00:30Z", "Unhealthy", serving["metadata"]["name"], "Startup probe failed: NOT-YET"),
        event(
            "2026-11-29T07:00:02Z", "Pulled", serving["metadata"]["name"], "Container image already present", "Normal"
        ),
        event("2026-11-29T07:00:40Z", "Scheduled", "glm53-flash-validate", "Successfully assigned", "Normal"),
    ]
    name = serving["metadata"]["name"]
    logs = {f"{name}/lmcache": "lmcache up\n", f"{name}/vllm": "engine log\n", f"{name}/vllm/previous": "died\n"}
    reader = FakeReader([serving, tester], events, logs)
    artifacts = {str(a.path): a.text for a in ks.collect_artifacts(reader, "glm53-smoke")}
    assert sorted(artifacts) == [
        "events.txt",
        f"{name}/describe.txt",
        f"{name}/lmcache.log",
        f"{name}/vllm.log",
        f"{name}/vllm.previous.log",
        "glm53-flash-validate/describe.txt",
        "glm53-flash-validate/validate.log",
    ]
    assert reader.asked == [f"{name}/lmcache", f"{name}/vllm", f"{name}/vllm/previous", "glm53-flash-validate/validate"]
    assert artifacts[f"{name}/vllm.previous.log"] == "died\n"
    assert artifacts["glm53-flash-validate/validate.log"] == (
        '(could not read the log of container validate: (400) Bad Request: container "validate" in pod '
        '"glm53-flash-validate" is waiting to start)\n'
    )
    assert artifacts["events.txt"].splitlines() == [
        f"2026-11-29T07:00:02Z  Normal  Pulled  Pod/{name}  x3  Container image already present",
        f"2026-11-29T07:00:30Z  Warning  Unhealthy  Pod/{name}  x3  Startup probe failed: NOT-YET",
        "2026-11-29T07:00:40Z  Normal  Scheduled  Pod/glm53-flash-validate  x3  Successfully assigned",
    ]
    describe = artifacts[f"{name}/describe.txt"]
    assert "Container lmcache (init/sidecar): image glm53/mock:kind-smoke" in describe
    assert "Container vllm (container): image glm53/mock:kind-smoke" in describe
    assert "  restarts: 2  last state: {'terminated': {'exitCode': 1, 'reason': 'Error'}}" in describe
    assert "  startupProbe: {'exec': {'command': ['glm53']}}" in describe
    assert describe.endswith(
        f"Events:\n2026-11-29T07:00:02Z  Normal  Pulled  Pod/{name}  x3  Container image already present\n"
        f"2026-11-29T07:00:30Z  Warning  Unhealthy  Pod/{name}  x3  Startup probe failed: NOT-YET\n"
    )


def test_artifacts_of_an_empty_namespace_still_say_so() -> None:
    artifacts = ks.collect_artifacts(FakeReader([], [], {}), "glm53-smoke")
    assert artifacts == [ks.Artifact(PurePath("events.txt"), "(no events)\n")]


# ------------------------------------------------------------------------------------------ the plan meets the chart


@pytest.mark.parametrize(
    ("profile", "engine"), [("glm53-flash", "standin"), ("glm53", "standin"), ("tiny-dense", "vllm")]
)
def test_the_install_command_renders_the_pod_the_smoke_test_waits_for(profile: str, engine: str) -> None:
    # `helm template` with the very arguments of the planned `helm install` (minus the cluster-only flags), at the
    # pinned node image's Kubernetes version: the chart must accept them and render what the later steps rely on.
    helm = _tool("helm", "20-helm.sh")
    options = ks.SmokeOptions(profile=get_profile(profile), engine=engine)
    install = list(ks.helm_install_argv(options))
    assert install[:2] == ["helm", "install"]
    cluster_only = {"--create-namespace", "--kube-context", options.context}
    args = [arg for arg in install[2:] if arg not in cluster_only]
    kube_version = ks.format_version(ks.node_image_kubernetes(options.node_image) or ks.MIN_NODE_KUBERNETES)
    done = subprocess.run(
        [helm, "template", *args, "--kube-version", kube_version], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    assert "PersistentVolumeClaim" not in by_kind  # weights.source=none
    (service,) = by_kind["Service"]
    assert service["metadata"]["name"] == ks.service_name(options)
    assert [p["port"] for p in service["spec"]["ports"]] == [ks.VLLM_PORT]
    (deployment,) = by_kind["Deployment"]
    template = deployment["spec"]["template"]
    selector = dict(item.split("=") for item in ks.WaitReady("c", "n", options.release, 1).selector.split(","))
    assert selector.items() <= template["metadata"]["labels"].items()
    serving_pod = {"spec": template["spec"]}
    assert ks.is_serving_pod(serving_pod)
    makes_the_model = ["tiny-model"] if engine == "vllm" else []  # the real engine's init container
    expected_containers = [*makes_the_model, ks.SIDECAR_CONTAINER, ks.ENGINE_CONTAINER]
    assert [name for name, _ in ks.containers_of(serving_pod)] == expected_containers
    (sidecar,) = [c for c in template["spec"]["initContainers"] if c.get("restartPolicy") == "Always"]
    assert sidecar["name"] == ks.SIDECAR_CONTAINER
    for container in [*template["spec"]["initContainers"], *template["spec"]["containers"]]:
        assert (container["image"], container["imagePullPolicy"]) == (options.mock_image, "Never")
    (engine_container,) = [c for c in template["spec"]["containers"] if c["name"] == ks.ENGINE_CONTAINER]
    served = " ".join(engine_container["args"] if engine == "vllm" else engine_container["command"])
    assert ("vllm.entrypoints.openai.api_server" in served) == (engine == "vllm"), served
    (test_pod,) = [pod for pod in by_kind["Pod"] if pod["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    assert not ks.is_serving_pod(test_pod)
    assert f"--profile {profile}" in " ".join(test_pod["spec"]["containers"][0]["args"])


# ------------------------------------------------------------------------- the run's cluster edge, with fake data


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scripted_watch(clock: FakeClock, windows: list[list[tuple[float, dict[str, Any]]]]) -> PodWatch:
    """One list of (seconds later, pod) per watch request; a request past the script yields nothing but time."""

    def watch_pods(seconds: float) -> Iterator[ks.KubeObject]:
        if not windows:
            clock.now += seconds
            return
        for delay, snapshot in windows.pop(0):
            clock.now += delay
            yield snapshot

    return watch_pods


READY_POD = pod(
    conditions={"PodScheduled": "True", "Ready": "True"},
    sidecar={"started": True},
    engine={"started": True, **RUNNING},
    phase="Running",
)


def test_wait_ready_prints_milestones_across_watch_requests(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    helm_test_pod = {"metadata": {"name": "glm53-flash-validate"}, "spec": {"containers": [{"name": "validate"}]}}
    windows = [
        [(0.5, pod(conditions={"PodScheduled": "True"})), (0.1, helm_test_pod)],
        [(3.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True})), (9.0, READY_POD)],
    ]
    step = ks.WaitReady("kind-glm53-smoke", "glm53-smoke", "glm53-flash", 600)
    kind_smoke_cmd.wait_ready(step, scripted_watch(clock, windows), clock)
    assert capsys.readouterr().out.splitlines() == [
        "kind-smoke: ready: glm53-flash-7d9f-abcde: scheduled (+0.5s, 0.5s total)",
        "kind-smoke: ready: glm53-flash-7d9f-abcde: sidecar lmcache started (+3.1s, 3.6s total)",
        "kind-smoke: ready: glm53-flash-7d9f-abcde: vllm running (+9.0s, 12.6s total)",
        "kind-smoke: ready: glm53-flash-7d9f-abcde: startup probe passed (+0.0s, 12.6s total)",
        "kind-smoke: ready: glm53-flash-7d9f-abcde: Ready (+0.0s, 12.6s total)",
    ]


def test_wait_ready_times_out_with_where_the_pod_stands() -> None:
    clock = FakeClock()
    windows = [[(1.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True}))]]
    step = ks.WaitReady("kind-glm53-smoke", "glm53-smoke", "glm53-flash", 90)
    with pytest.raises(kind_smoke_cmd.StepFailed) as failed:
        kind_smoke_cmd.wait_ready(step, scripted_watch(clock, windows), clock)
    assert failed.value.phase.exit_code == 13
    assert failed.value.message == (
        "not Ready after 90s: pod glm53-flash-7d9f-abcde reached [scheduled, sidecar lmcache started], "
        "not [vllm running, startup probe passed, Ready]"
    )


def test_wait_ready_fails_at_once_on_a_restart_or_a_broken_watch() -> None:
    clock = FakeClock()
    restarted = pod(engine={"restartCount": 1, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})
    step = ks.WaitReady("kind-glm53-smoke", "glm53-smoke", "glm53-flash", 600)
    with pytest.raises(kind_smoke_cmd.StepFailed, match=r"container vllm of pod .* restarted 1 time"):
        kind_smoke_cmd.wait_ready(step, scripted_watch(clock, [[(2.0, restarted)]]), clock)

    def broken(seconds: float) -> Iterator[ks.KubeObject]:
        raise ConnectionError("connection refused\n by 127.0.0.1:6443")

    with pytest.raises(kind_smoke_cmd.StepFailed) as failed:
        kind_smoke_cmd.wait_ready(step, broken, clock)
    assert failed.value.message == "watching pods failed: connection refused by 127.0.0.1:6443"


def test_show_geometry_reads_both_containers_of_the_release_pod(capsys: pytest.CaptureFixture[str]) -> None:
    name = READY_POD["metadata"]["name"]
    no_newline = "\n".join(example_log("healthy"))  # the last line of a log need not end with a newline
    reader = FakeReader([READY_POD], [], {f"{name}/vllm": no_newline, f"{name}/lmcache": "server up\n"})
    step = ks.ShowGeometry("kind-glm53-smoke", "glm53-smoke", "glm53-flash", get_profile("glm53-flash"))
    kind_smoke_cmd.show_geometry(step, reader)
    assert capsys.readouterr().out.splitlines() == [
        "kind-smoke: unified block size N = 1152 tokens",
        "kind-smoke: geometry: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152 "
        "(as expected)",
    ]
    assert reader.asked == [f"{name}/vllm", f"{name}/lmcache"]
    other_release = ks.ShowGeometry("kind-glm53-smoke", "glm53-smoke", "glm53", get_profile("glm53"))
    with pytest.raises(kind_smoke_cmd.StepFailed, match="no serving pod of release glm53 found in glm53-smoke"):
        kind_smoke_cmd.show_geometry(other_release, reader)


def test_artifacts_are_written_under_a_folder_per_run(tmp_path: Path) -> None:
    name = READY_POD["metadata"]["name"]
    reader = FakeReader([READY_POD], [], {f"{name}/vllm": "engine\n", f"{name}/lmcache": "server\n"})
    options = ks.SmokeOptions(profile=get_profile("glm53-flash"), artifacts=PurePath(tmp_path / "out"))
    folder = kind_smoke_cmd.write_artifacts(options, reader)
    assert folder.parent == tmp_path / "out"
    assert folder.name.startswith("glm53-flash-")
    written = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    assert written == ["events.txt", f"{name}/describe.txt", f"{name}/lmcache.log", f"{name}/vllm.log"]
    assert (folder / name / "vllm.log").read_text() == "engine\n"


# ------------------------------------------------ whole runs against a fake Kubernetes API server on loopback

NAMESPACE_PATH = "/api/v1/namespaces/glm53-smoke/"
SERVING_POD_NAME = "glm53-flash-7d9f-abcde"


def api_pod(status: Mapping[str, Any]) -> dict[str, Any]:
    """The serving pod as the API server sends it: every field the client's models require is present."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": SERVING_POD_NAME,
            "namespace": "glm53-smoke",
            "labels": {ks.INSTANCE_LABEL: "glm53-flash", ks.COMPONENT_LABEL: ks.ENGINE_COMPONENT},
        },
        "spec": {
            "initContainers": [{"name": "lmcache", "image": "glm53/mock:0.1.0", "restartPolicy": "Always"}],
            "containers": [{"name": "vllm", "image": "glm53/mock:0.1.0"}],
        },
        "status": status,
    }


def api_container(name: str, state: Mapping[str, Any], started: bool) -> dict[str, Any]:
    return {
        "name": name,
        "image": "glm53/mock:0.1.0",
        "imageID": "",
        "ready": started,
        "started": started,
        "restartCount": 0,
        "state": state,
    }


STUCK_API_POD = api_pod(
    {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "initContainerStatuses": [
            api_container(
                "lmcache", {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}, False
            )
        ],
        "containerStatuses": [api_container("vllm", {"waiting": {"reason": "PodInitializing"}}, False)],
    }
)
RUNNING_STATE = {"running": {"startedAt": "2026-11-29T07:00:05Z"}}
READY_API_POD = api_pod(
    {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "initContainerStatuses": [api_container("lmcache", RUNNING_STATE, True)],
        "containerStatuses": [api_container("vllm", RUNNING_STATE, True)],
    }
)
API_EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "e1", "namespace": "glm53-smoke"},
    "involvedObject": {"kind": "Pod", "name": SERVING_POD_NAME},
    "reason": "Pulled",
    "message": "Container image already present on machine",
    "type": "Normal",
    "count": 1,
    "lastTimestamp": "2026-11-29T07:00:02Z",
}


class FakeApiServer:
    """Answers the four requests the run makes (watch pods, list pods, list events, read a log) for one namespace."""

    def __init__(self, pod_object: dict[str, Any], logs: Mapping[str, str]) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query)
                server.requests.append(url.path + ("?watch" if query.get("watch") == ["true"] else ""))
                if url.path == NAMESPACE_PATH + "pods" and query.get("watch") == ["true"]:
                    self.reply(json.dumps({"type": "ADDED", "object": pod_object}) + "\n", "application/json")
                elif url.path == NAMESPACE_PATH + "pods":
                    self.reply(json.dumps({"kind": "PodList", "items": [pod_object]}), "application/json")
                elif url.path == NAMESPACE_PATH + "events":
                    self.reply(json.dumps({"kind": "EventList", "items": [API_EVENT]}), "application/json")
                elif url.path == f"{NAMESPACE_PATH}pods/{SERVING_POD_NAME}/log":
                    self.reply(logs.get(query["container"][0], ""), "text/plain")
                else:
                    self.send_error(404)

            def reply(self, body: str, content_type: str) -> None:
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.requests: list[str] = []
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def kubeconfig(self, folder: Path) -> Path:
        """A kubeconfig whose `kind-glm53-smoke` context points at this server (plain HTTP, a dummy token)."""
        path = folder / "kubeconfig"
        server = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": server}}],
                    "users": [{"name": "smoke", "user": {"token": "not-a-secret"}}],
                    "contexts": [{"name": "kind-glm53-smoke", "context": {"cluster": "fake", "user": "smoke"}}],
                    "current-context": "kind-glm53-smoke",
                }
            )
        )
        return path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


FAKE_KUBECTL = """#!{python}
# kubectl stand-in: answers `version`, and for `port-forward` accepts connections on the local port and closes them
# (so validation finds nothing that speaks HTTP) until it is terminated.
import signal, socket, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write("kubectl " + " ".join(args) + "\\n")
if args[:1] == ["version"]:
    print("Client Version: v1.34.2")
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
listener = socket.socket()
listener.bind(("127.0.0.1", int(args[-1].split(":")[0])))
listener.listen()
while True:
    listener.accept()[0].close()
"""


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[FakeApiServer]:
    pod_object, logs = request.param
    server = FakeApiServer(pod_object, logs)
    yield server
    server.close()


def artifact_files(root: Path) -> list[str]:
    (folder,) = (root / "artifacts" / "kind-smoke").iterdir()
    assert folder.name.startswith("glm53-flash-")
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


@pytest.mark.parametrize("api", [(STUCK_API_POD, {})], indirect=True)
def test_a_stuck_pod_exits_13_with_artifacts_and_teardown(machine: FakeMachine, api: FakeApiServer) -> None:
    done = machine.run(env={"KUBECONFIG": str(api.kubeconfig(machine.root))})
    assert done.returncode == 13, done.stderr
    assert "kind-smoke: ready: glm53-flash-7d9f-abcde: scheduled (+" in done.stdout
    stderr = done.stderr.splitlines()
    assert stderr[-1] == (
        "glm53 kind-smoke: error: ready failed: container lmcache of pod glm53-flash-7d9f-abcde is stuck in "
        "ErrImageNeverPull: image not present"
    )
    assert any(
        line.startswith("kind-smoke: artifacts (describe, events, logs of every container) in ") for line in stderr
    )
    assert artifact_files(machine.root) == [
        "events.txt",
        f"{SERVING_POD_NAME}/describe.txt",
        f"{SERVING_POD_NAME}/lmcache.log",
        f"{SERVING_POD_NAME}/vllm.log",
    ]
    assert NAMESPACE_PATH + "pods?watch" in api.requests
    assert machine.calls()[-1] == KIND_DELETE


@pytest.mark.parametrize("api", [(READY_API_POD, {"vllm": "\n".join(example_log("healthy")) + "\n"})], indirect=True)
def test_a_ready_pod_reaches_validation_through_the_port_forward(machine: FakeMachine, api: FakeApiServer) -> None:
    (machine.bin / "kubectl").write_text(FAKE_KUBECTL.format(python=sys.executable, log=str(machine.log)))
    done = machine.run(env={"KUBECONFIG": str(api.kubeconfig(machine.root))})
    assert done.returncode == 14, done.stderr
    out = done.stdout.splitlines()
    progress = [line.split(" (+")[0] for line in out if line.startswith("kind-smoke: ready: ")]
    assert progress == [
        f"kind-smoke: ready: {SERVING_POD_NAME}: {milestone}"
        for milestone in ("scheduled", "sidecar lmcache started", "vllm running", "startup probe passed", "Ready")
    ]
    assert (
        "kind-smoke: geometry: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152 "
        "(as expected)"
    ) in out
    calls = machine.calls()
    helm_test = "helm test glm53-flash --logs --timeout 10m --kube-context kind-glm53-smoke --namespace glm53-smoke"
    forward = next(call for call in calls if " port-forward " in call)
    assert calls.index(helm_test) < calls.index(forward) < calls.index(KIND_DELETE)
    assert forward.startswith("kubectl --context kind-glm53-smoke --namespace glm53-smoke port-forward --address ")
    assert "cannot reach vLLM at http://127.0.0.1:" in done.stderr  # glm53 validate's own message
    assert done.stderr.splitlines()[-1].startswith("glm53 kind-smoke: error: validate failed: `glm53 validate ")
    assert f"{SERVING_POD_NAME}/vllm.log" in artifact_files(machine.root)


# ------------------------------------------------------------------------------ the operations guide tells the truth

OPERATIONS = REPO / "docs" / "operations.md"


def table_row(text: str, first_cell: str) -> list[str]:
    """The cells of the Markdown table row whose first cell is `first_cell`."""
    (line,) = [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_the_operations_guide_agrees_with_the_profiles() -> None:
    text = OPERATIONS.read_text()
    profiles = [get_profile("glm53-flash"), get_profile("glm53")]
    assert table_row(text, "GPUs per pod (TP)") == [str(p.tensor_parallel_size) for p in profiles]
    expected = [p.expected_groups(p.unified_block_size(p.tensor_parallel_size)) for p in profiles]
    assert table_row(text, "expected `group_tokens_per_block`") == [f"`{list(groups)}`" for groups in expected]
    chunks = table_row(text, "LMCache `--chunk-size` the chart passes")
    assert [cell.split()[0] for cell in chunks] == [str(p.recommended_chunk_size) for p in profiles]
    assert [p.model_id for p in profiles] == [cell.split("`")[1] for cell in table_row(text, "model")]


def test_the_operations_guide_documents_the_smoke_tests_exit_codes_and_node_image() -> None:
    text = OPERATIONS.read_text()
    assert ks.NODE_IMAGE in text
    start = text.index("| exit | failed phase |")
    rows = text[start:].split("\n\n")[0].splitlines()[2:]
    documented = {int(row.split("|")[1]) for row in rows}
    assert documented == {0, 2} | {phase.exit_code for phase in ks.Phase}
