"""Running a kind smoke test, as far as a machine without Docker registry or Kubernetes honestly allows.

CI has neither, so: shellcheck of the entry point and its hand-off to `glm53 kind-smoke`; whole runs driven by tiny fake
`docker`/`kind`/`kubectl`/`ansible-playbook`/`helm` scripts on a temporary PATH (preflight, exit codes 10 to 12, and
the teardown each path does or must not do); the cluster edge (waiting for Ready, the geometry, the artifacts) with
fake data; and, past the install, whole runs against a fake Kubernetes API server on loopback (exit codes 13 and 14,
the artifacts, the port-forward).
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

from glm53.pod.contract import COMPONENT_LABEL, ENGINE_COMPONENT, INSTANCE_LABEL
from glm53.pod.kind.plan import ShowGeometry, SmokeOptions, WaitReady
from glm53.pod.kind.preflight import NODE_IMAGE
from glm53.pod.kind.run import PodWatch, StepFailed, show_geometry, wait_ready, write_artifacts
from glm53.pod.kind.verdicts import KubeObject
from glm53.profiles import get_profile
from tests.support.kindkit import (
    BUILD_LOGGED,
    FLASH_HELM,
    KIND_DELETE,
    READY_POD,
    REPO,
    FakeReader,
    example_log,
    pod,
    tool,
)

SCRIPT = REPO / "scripts" / "kind-smoke.sh"


# ------------------------------------------------------------------------------------------------------ the entry point


def test_entry_point_is_shellcheck_clean() -> None:
    done = subprocess.run(
        [tool("shellcheck", "32-lint-tools.sh"), "--severity=style", str(SCRIPT)], capture_output=True, text=True
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

    def preflight_problems(self, *args: str) -> list[str]:
        """The lines `kind-smoke --preflight-only ARGS` prints on stderr; it must fail its preflight (exit 10)."""
        done = self.run("--preflight-only", *args)
        assert done.returncode == 10, done.stdout + done.stderr
        return done.stderr.splitlines()


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


@pytest.mark.parametrize(
    ("tools", "missing", "problems"),
    [
        pytest.param(
            {
                "kind": {"version": ("kind v0.20.0 go1.20.4 linux/amd64", 0)},
                "kubectl": {"version": ("Client Version: v1.27.3\nKustomize Version: v5.0.1", 0)},
            },
            ("helm",),
            [
                "kind-smoke: preflight: kind 0.20.0 is too old; need >= 0.33.0 because the pinned node image is built "
                "for kind v0.33.0 (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)",
                "kind-smoke: preflight: kubectl 1.27.3 is too old; need >= 1.33.0 because kubectl must be within 1 "
                "minor version of the node's Kubernetes 1.34.11 (https://kubernetes.io/docs/tasks/tools/)",
                "kind-smoke: preflight: helm not found on PATH; install helm >= 3.10.0 "
                "(https://helm.sh/docs/intro/install/)",
                "glm53 kind-smoke: error: preflight failed: 3 problem(s), listed above; fix them and rerun",
            ],
            id="old kind and kubectl, no helm",
        ),
        pytest.param(
            {
                "docker": {
                    "--version": ("Docker version 28.2.2, build e6534b4", 0),
                    "info": ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.", 1),
                },
            },
            (),
            [
                "kind-smoke: preflight: docker is installed but its daemon is not reachable (`docker info` said: "
                "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.); start Docker or give this user "
                "access to its socket",
                "glm53 kind-smoke: error: preflight failed: 1 problem(s), listed above; fix them and rerun",
            ],
            id="unreachable docker daemon",
        ),
    ],
)
def test_preflight_names_each_problem_in_one_line_and_exits_10(
    machine: FakeMachine, tools: dict[str, dict[str, tuple[str, int]]], missing: tuple[str, ...], problems: list[str]
) -> None:
    for name, responses in tools.items():
        machine.tool(name, responses)
    for name in missing:
        (machine.bin / name).unlink()
    assert machine.preflight_problems() == problems


def test_preflight_reports_old_docker_and_unreadable_versions(machine: FakeMachine) -> None:
    machine.tool("docker", {"--version": ("Docker version 19.03.15, build 99e3ed8", 0)})
    machine.tool("helm", {"version": ("helm: command crashed", 1)})
    assert machine.preflight_problems()[:2] == [
        "kind-smoke: preflight: docker 19.3.15 is too old; need >= 20.10.0 because kind's node containers need a "
        "cgroup v2-aware Docker Engine (https://docs.docker.com/engine/install/)",
        "kind-smoke: preflight: could not read helm's version from `helm version --short` "
        "(got 'helm: command crashed'); install helm >= 3.10.0 (https://helm.sh/docs/intro/install/)",
    ]
    assert "docker info --format {{.ServerVersion}}" not in machine.calls()  # no daemon check behind an old client


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
    assert f"kind-smoke: preflight: {message}" in machine.preflight_problems("--node-image", image)


def test_preflight_refuses_a_busy_port_and_a_wrong_working_directory(machine: FakeMachine) -> None:
    shutil.rmtree(machine.root / "charts")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        problems = machine.preflight_problems("--local-port", str(port))
    assert problems[:2] == [
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


# ------------------------------------------------------------------------- the run's cluster edge, with fake data


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scripted_watch(clock: FakeClock, windows: list[list[tuple[float, dict[str, Any]]]]) -> PodWatch:
    """One list of (seconds later, pod) per watch request; a request past the script yields nothing but time."""

    def watch_pods(seconds: float) -> Iterator[KubeObject]:
        if not windows:
            clock.now += seconds
            return
        for delay, snapshot in windows.pop(0):
            clock.now += delay
            yield snapshot

    return watch_pods


def test_wait_ready_prints_milestones_across_watch_requests(capsys: pytest.CaptureFixture[str]) -> None:
    clock = FakeClock()
    helm_test_pod = {"metadata": {"name": "glm53-flash-validate"}, "spec": {"containers": [{"name": "validate"}]}}
    windows = [
        [(0.5, pod(conditions={"PodScheduled": "True"})), (0.1, helm_test_pod)],
        [(3.0, pod(conditions={"PodScheduled": "True"}, sidecar={"started": True})), (9.0, READY_POD)],
    ]
    step = WaitReady("kind-glm53-smoke", "glm53-smoke", "glm53-flash", 600)
    wait_ready(step, scripted_watch(clock, windows), clock)
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
    step = WaitReady("kind-glm53-smoke", "glm53-smoke", "glm53-flash", 90)
    with pytest.raises(StepFailed) as failed:
        wait_ready(step, scripted_watch(clock, windows), clock)
    assert failed.value.phase.exit_code == 13
    assert failed.value.message == (
        "not Ready after 90s: pod glm53-flash-7d9f-abcde reached [scheduled, sidecar lmcache started], "
        "not [vllm running, startup probe passed, Ready]"
    )


def test_wait_ready_fails_at_once_on_a_restart_or_a_broken_watch() -> None:
    clock = FakeClock()
    restarted = pod(engine={"restartCount": 1, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}})
    step = WaitReady("kind-glm53-smoke", "glm53-smoke", "glm53-flash", 600)
    with pytest.raises(StepFailed, match=r"container vllm of pod .* restarted 1 time"):
        wait_ready(step, scripted_watch(clock, [[(2.0, restarted)]]), clock)

    def broken(seconds: float) -> Iterator[KubeObject]:
        raise ConnectionError("connection refused\n by 127.0.0.1:6443")

    with pytest.raises(StepFailed) as failed:
        wait_ready(step, broken, clock)
    assert failed.value.message == "watching pods failed: connection refused by 127.0.0.1:6443"


def test_show_geometry_reads_both_containers_of_the_release_pod(capsys: pytest.CaptureFixture[str]) -> None:
    name = READY_POD["metadata"]["name"]
    no_newline = "\n".join(example_log("healthy"))  # the last line of a log need not end with a newline
    reader = FakeReader([READY_POD], [], {f"{name}/vllm": no_newline, f"{name}/lmcache": "server up\n"})
    step = ShowGeometry("glm53-smoke", "glm53-flash", get_profile("glm53-flash"))
    show_geometry(step, reader)
    assert capsys.readouterr().out.splitlines() == [
        "kind-smoke: unified block size N = 1152 tokens",
        "kind-smoke: geometry: group_tokens_per_block=[1152, 1152, 1152, 1152, 1152, 0], scheduler_block_size=1152 "
        "(as expected)",
    ]
    assert reader.asked == [f"{name}/vllm", f"{name}/lmcache"]
    other_release = ShowGeometry("glm53-smoke", "glm53", get_profile("glm53"))
    with pytest.raises(StepFailed, match="no serving pod of release glm53 found in glm53-smoke"):
        show_geometry(other_release, reader)


def test_artifacts_are_written_under_a_folder_per_run(tmp_path: Path) -> None:
    name = READY_POD["metadata"]["name"]
    reader = FakeReader([READY_POD], [], {f"{name}/vllm": "engine\n", f"{name}/lmcache": "server\n"})
    options = SmokeOptions(profile=get_profile("glm53-flash"), artifacts=PurePath(tmp_path / "out"))
    folder = write_artifacts(options, reader)
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
            "labels": {INSTANCE_LABEL: "glm53-flash", COMPONENT_LABEL: ENGINE_COMPONENT},
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
