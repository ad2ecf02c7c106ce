"""Run a planned kind smoke test: execute its steps, watch the cluster, collect the failure report, tear down.

Why: this is the smoke test's one I/O edge. It starts processes (kind, helm, ansible-playbook, the port-forward,
`glm53 validate`), talks to the cluster through the Kubernetes Python client (never by parsing `kubectl` output), writes
the artifacts and always tears down what it created. What to run comes from `glm53.pod.kind.plan`, what to make of
what the cluster says from `glm53.pod.kind.preflight` and `glm53.pod.kind.verdicts`; keeping the judgement there keeps
this module to the doing. `glm53 kind-smoke` (`glm53.commands.kind_smoke`) calls `execute` and `check_preflight`.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glm53.errors import Glm53Error
from glm53.pod.contract import ENGINE_CONTAINER, INSTANCE_LABEL, SIDECAR_CONTAINER
from glm53.pod.kind.plan import (
    BUILD_PLAYBOOK,
    CHART_DIR,
    EnsureCluster,
    Phase,
    Plan,
    PortForwardValidate,
    Preflight,
    Run,
    ShowGeometry,
    SmokeOptions,
    Step,
    WaitReady,
    preflight_step,
)
from glm53.pod.kind.preflight import (
    DOCKER_DAEMON_ARGV,
    ToolProbe,
    judge_docker_daemon,
    judge_node_image,
    judge_tool,
)
from glm53.pod.kind.verdicts import (
    ClusterReader,
    KubeObject,
    ReadinessTracker,
    collect_artifacts,
    geometry_lines,
    is_serving_pod,
    pending_summary,
    pod_failure,
)
from glm53.probe.logparse import parse_lines

PREFIX = "kind-smoke:"
# How long to wait for `kubectl port-forward` to accept connections before calling the forward broken.
PORT_FORWARD_WAIT_S = 30.0
VERSION_TIMEOUT_S = 30.0
# Longest single watch request while waiting for Ready; the deadline is checked between requests.
WATCH_WINDOW_S = 30.0


class StepFailed(Exception):
    """A step went wrong; carries the phase (hence the exit code) and one sentence for the person."""

    def __init__(self, phase: Phase, message: str) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message


def say(text: str) -> None:
    print(f"{PREFIX} {text}", flush=True)


def warn(text: str) -> None:
    print(f"{PREFIX} {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------------ processes


def _resolve(argv: Sequence[str]) -> list[str]:
    """`glm53 ...` runs with this interpreter, so the run uses the toolkit it was started from."""
    return [sys.executable, "-m", "glm53", *argv[1:]] if argv and argv[0] == "glm53" else list(argv)


def run_process(phase: Phase, argv: Sequence[str], env: Sequence[tuple[str, str]] = ()) -> None:
    try:
        status = subprocess.run(_resolve(argv), env={**os.environ, **dict(env)}, check=False).returncode
    except OSError as error:
        raise StepFailed(phase, f"could not start `{shlex.join(argv)}`: {error}") from None
    if status != 0:
        raise StepFailed(phase, f"`{shlex.join(argv)}` exited with status {status}")


def capture(argv: Sequence[str]) -> ToolProbe:
    """Run a read-only command and keep its output (stdout then stderr); not on PATH is `found=False`."""
    if shutil.which(argv[0]) is None:
        return ToolProbe(found=False)
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return ToolProbe(found=True, output=str(error), failed=True)
    return ToolProbe(found=True, output=done.stdout + done.stderr, failed=done.returncode != 0)


def preflight(step: Preflight, options: SmokeOptions) -> None:
    """Check every tool, the Docker daemon, the node image and the repository; print one line each."""
    problems = 0

    def report(ok: bool, line: str) -> None:
        nonlocal problems
        if ok:
            say(f"preflight: {line}")
        else:
            problems += 1
            warn(f"preflight: {line}")

    for requirement in step.requirements:
        ok, line = judge_tool(requirement, capture(requirement.version_argv))
        report(ok, line)
        if ok and requirement.name == "docker":
            report(*judge_docker_daemon(capture(DOCKER_DAEMON_ARGV)))
    report(*judge_node_image(step.node_image))
    for needed in (CHART_DIR, BUILD_PLAYBOOK):
        if not Path(needed).exists():
            report(False, f"{needed} not found under {Path.cwd()}; run from the repository root (the script does)")
    if not port_is_free(options.local_port):
        report(False, f"local port {options.local_port} is in use; pass --local-port with a free port")
    if problems:
        raise StepFailed(Phase.PREFLIGHT, f"{problems} problem(s), listed above; fix them and rerun")


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def ensure_cluster(step: EnsureCluster, state: RunState) -> None:
    listed = subprocess.run(["kind", "get", "clusters"], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        raise StepFailed(step.phase, f"`kind get clusters` failed: {(listed.stderr or listed.stdout).strip()[:200]}")
    exists = step.name in listed.stdout.split()
    if exists and not step.reuse:
        raise StepFailed(
            step.phase,
            f"a kind cluster named {step.name!r} already exists; pass --reuse to use it, or --name for another one",
        )
    state.cluster_ours = True  # from here on, the run is responsible for the cluster (or for the release in it)
    if exists:
        say(f"cluster: reusing kind cluster {step.name!r}")
    else:
        run_process(step.phase, step.create_argv)
    run_process(step.phase, step.export_argv)


@contextlib.contextmanager
def port_forward(step: PortForwardValidate) -> Iterator[None]:
    """`kubectl port-forward` in the background for the duration of the block; waits until the port answers."""
    # Output goes to a file, not a pipe: kubectl logs every connection, and a pipe nobody drains would block it.
    with tempfile.TemporaryFile(mode="w+") as output:
        forward = subprocess.Popen(list(step.forward_argv), stdout=output, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + PORT_FORWARD_WAIT_S
            while not _accepts(step.local_port):
                if forward.poll() is not None:
                    output.seek(0)
                    said = " ".join(output.read().split())[:200]
                    raise StepFailed(step.phase, f"port-forward exited with {forward.returncode}: {said}")
                if time.monotonic() > deadline:
                    raise StepFailed(
                        step.phase,
                        f"port-forward did not open 127.0.0.1:{step.local_port} within {PORT_FORWARD_WAIT_S:g}s",
                    )
                time.sleep(0.2)
            yield
        finally:
            forward.terminate()
            try:
                forward.wait(timeout=5)
            except subprocess.TimeoutExpired:
                forward.kill()
                forward.wait()


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------------------------------------- the cluster


def _kubernetes(module: str) -> Any:
    """A submodule of the Kubernetes client (the `ops` extra), imported only by the steps that talk to the cluster."""
    return importlib.import_module(f"kubernetes.{module}")


class KubeReader:
    """`ClusterReader` over the Kubernetes Python client, pinned to one kubeconfig context."""

    def __init__(self, context: str) -> None:
        self.api_client: Any = _kubernetes("config").new_client_from_config(context=context)
        self.core: Any = _kubernetes("client").CoreV1Api(self.api_client)

    def plain(self, obj: Any) -> dict[str, Any]:
        return dict(self.api_client.sanitize_for_serialization(obj))

    def pods(self, namespace: str) -> list[KubeObject]:
        return [self.plain(pod) for pod in self.core.list_namespaced_pod(namespace).items]

    def events(self, namespace: str) -> list[KubeObject]:
        return [self.plain(event) for event in self.core.list_namespaced_event(namespace).items]

    def log(self, namespace: str, pod: str, container: str, previous: bool) -> str:
        return str(self.core.read_namespaced_pod_log(pod, namespace, container=container, previous=previous))

    def pod_watch(self, step: WaitReady) -> PodWatch:
        """Watch the step's pods through the API: each call is one watch request of at most `seconds`."""

        def watch_pods(seconds: float) -> Iterator[KubeObject]:
            stream = _kubernetes("watch").Watch()
            try:
                for event in stream.stream(
                    self.core.list_namespaced_pod,
                    namespace=step.namespace,
                    label_selector=step.selector,
                    timeout_seconds=max(1, int(seconds)),
                ):
                    yield self.plain(event["object"])
            finally:
                stream.stop()

        return watch_pods


# Pod snapshots for at most the given number of seconds (one watch request); the real one is `KubeReader.pod_watch`.
PodWatch = Callable[[float], Iterator[KubeObject]]


def wait_ready(step: WaitReady, watch_pods: PodWatch, clock: Callable[[], float] = time.monotonic) -> None:
    """Follow the serving pod until Ready, one progress line per milestone; fail at once when it is stuck."""
    start = clock()
    deadline = start + step.timeout_s
    tracker = ReadinessTracker(start)
    while not tracker.ready():
        remaining = deadline - clock()
        if remaining <= 0:
            where = "; ".join(pending_summary(pod) for pod in tracker.latest.values()) or "no serving pod appeared"
            raise StepFailed(step.phase, f"not Ready after {step.timeout_s:g}s: {where}")
        try:
            for pod in watch_pods(min(remaining, WATCH_WINDOW_S)):
                if not is_serving_pod(pod):
                    continue
                for line in tracker.observe(pod, clock()):
                    say(f"ready: {line}")
                failure = pod_failure(pod)
                if failure is not None:
                    raise StepFailed(step.phase, failure)
                if tracker.ready():
                    break
        except StepFailed:
            raise
        except Exception as error:  # API server or connection trouble while watching
            raise StepFailed(step.phase, f"watching pods failed: {' '.join(str(error).split())[:200]}") from None


def show_geometry(step: ShowGeometry, reader: ClusterReader) -> None:
    pods = [
        pod
        for pod in reader.pods(step.namespace)
        if is_serving_pod(pod) and pod.get("metadata", {}).get("labels", {}).get(INSTANCE_LABEL) == step.release
    ]
    if not pods:
        raise StepFailed(step.phase, f"no serving pod of release {step.release} found in {step.namespace}")
    name = pods[0]["metadata"]["name"]
    text = "\n".join(
        reader.log(step.namespace, name, container, False) for container in (ENGINE_CONTAINER, SIDECAR_CONTAINER)
    )
    for line in geometry_lines(parse_lines(text.splitlines()), step.profile):
        say(line)


def write_artifacts(options: SmokeOptions, reader: ClusterReader) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = Path(options.artifacts) / f"{options.release}-{stamp}"
    for artifact in collect_artifacts(reader, options.namespace):
        path = folder / artifact.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(artifact.text, encoding="utf-8")
    return folder


# ------------------------------------------------------------------------------------------------------------ run


@dataclass
class RunState:
    """What the run has done so far: decides whether teardown and artifact collection make sense."""

    cluster_ours: bool = False
    reached: set[Phase] = field(default_factory=set)
    reader: KubeReader | None = None


def execute_step(step: Step, options: SmokeOptions, state: RunState) -> None:
    if isinstance(step, Preflight):
        preflight(step, options)
    elif isinstance(step, EnsureCluster):
        ensure_cluster(step, state)
    elif isinstance(step, Run):
        run_process(step.phase, step.argv, step.env)
    elif isinstance(step, PortForwardValidate):
        with port_forward(step):
            run_process(step.phase, step.validate_argv)
    else:
        if state.reader is None:
            state.reader = KubeReader(options.context)
        if isinstance(step, WaitReady):
            wait_ready(step, state.reader.pod_watch(step))
        else:
            show_geometry(step, state.reader)


def teardown(plan: Plan, state: RunState) -> str | None:
    """Run the teardown steps; the first failure's message (or None). Never raises: teardown must always finish."""
    problem = None
    for step in plan.teardown:
        if step.needs is not None and step.needs not in state.reached:
            continue
        say(f"[{step.phase.label}] {step.title}")
        try:
            run_process(step.phase, step.argv)
        except StepFailed as failed:
            warn(failed.message)
            problem = problem or failed.message
    return problem


def execute(plan: Plan, options: SmokeOptions) -> int:
    """Run the plan's steps in order, collect the report after a failure past the install, then always tear down."""
    state = RunState()
    failure: StepFailed | None = None
    started = time.monotonic()
    try:
        for step in plan.steps:
            begin = time.monotonic()
            state.reached.add(step.phase)
            say(f"[{step.phase.label}] {step.title}")
            execute_step(step, options, state)
            say(f"[{step.phase.label}] ok in {time.monotonic() - begin:.1f}s")
    except StepFailed as failed:
        failure = failed
        warn(f"[{failed.phase.label}] FAILED: {failed.message}")
        if failed.phase in {Phase.INSTALL, Phase.READY, Phase.HELM_TEST, Phase.VALIDATE}:
            collect(options, state)
    finally:
        torn_down = teardown(plan, state) if state.cluster_ours else None
    if failure is not None:
        raise Glm53Error(f"{failure.phase.label} failed: {failure.message}", failure.phase.exit_code)
    if torn_down is not None:
        raise Glm53Error(f"teardown failed: {torn_down}", Phase.TEARDOWN.exit_code)
    say(f"passed in {time.monotonic() - started:.1f}s ({options.profile.name}, cluster {options.cluster})")
    return 0


def collect(options: SmokeOptions, state: RunState) -> None:
    try:
        reader = state.reader or KubeReader(options.context)
        folder = write_artifacts(options, reader)
    except Exception as error:  # the report is best effort; the original failure is what the exit code tells
        warn(f"could not collect artifacts: {' '.join(str(error).split())[:200]}")
        return
    warn(f"artifacts (describe, events, logs of every container) in {folder}/")


def check_preflight(options: SmokeOptions) -> int:
    """All of `--preflight-only`: the first step of a run, alone; a failure is the preflight's exit code."""
    try:
        preflight(preflight_step(options), options)
    except StepFailed as failed:
        raise Glm53Error(f"preflight failed: {failed.message}", failed.phase.exit_code) from None
    say("preflight passed")
    return 0
