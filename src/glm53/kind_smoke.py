"""Plan the kind-cluster smoke test of the chart in CPU-mock mode, and judge what the cluster reports back.

Everything here is pure: the plan is a list of typed steps built from the options, so `--dry-run` prints exactly what
a real run executes; tool versions, pod states and artifact listings are judged from plain data (strings, and pods and
events as the JSON dictionaries the Kubernetes API returns). `glm53.commands.kind_smoke` runs the steps and owns all
I/O (processes, the Kubernetes client, files). Keeping the judgement here lets the tests drive it with fake data, which
is all CI can honestly offer: it has no Docker registry and no Kubernetes.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Protocol

from glm53 import __version__
from glm53.logparse import (
    AttentionBlockSize,
    ChunkSizeRejected,
    EngineDied,
    MalformedLine,
    NegotiatedChunk,
    Record,
    ResolvedGeometry,
    ServerUnreachable,
)
from glm53.profiles import DEFAULT_PROFILE, ModelProfile

# A Kubernetes object as the API returns it: camelCase JSON turned into dictionaries and lists.
KubeObject = Mapping[str, Any]
Version = tuple[int, int, int]


class Phase(enum.Enum):
    """Where a run can fail; each phase owns the exit code that tells a person which part to look at."""

    PREFLIGHT = ("preflight", 10)
    CLUSTER = ("cluster", 11)
    IMAGE = ("image", 11)
    INSTALL = ("install", 12)
    READY = ("ready", 13)
    HELM_TEST = ("helm-test", 14)
    VALIDATE = ("validate", 14)
    TEARDOWN = ("teardown", 11)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def exit_code(self) -> int:
        return self.value[1]


EXIT_PREFLIGHT = Phase.PREFLIGHT.exit_code
EXIT_CLUSTER_OR_IMAGE = Phase.CLUSTER.exit_code
EXIT_INSTALL = Phase.INSTALL.exit_code
EXIT_READINESS = Phase.READY.exit_code
EXIT_VALIDATION = Phase.VALIDATE.exit_code

# The kind release whose notes list the node image below, and the image itself. kind supports a node image only with
# the release that built it, and only the digest guarantees that build (a tag can be re-pushed). v1.34.11 is the oldest
# Kubernetes that kind v0.33.0 ships, i.e. the closest to what GPU clusters run, and newer than the 1.29 where native
# sidecars (init containers with `restartPolicy: Always`) are on by default.
KIND_RELEASE: Version = (0, 33, 0)
NODE_IMAGE = "kindest/node:v1.34.11@sha256:44e222ee2132dab25ff87301682f89eb82c7880ea3a1bf543bfe9708fd08d67d"
MIN_NODE_KUBERNETES: Version = (1, 29, 0)
# kubectl is supported within one minor version of the API server.
KUBECTL_SKEW = 1

# The CPU mock image the chart runs with `mock.enabled=true` (the engine stand-in and the real vLLM CPU engine, and the
# real LMCache 0.5.6 server as the sidecar: 5.5 GB, so `kind load` takes a while), built from docker/mock/ by
# ansible/build-images.yml, which tags it with the toolkit version (and the git revision); the chart's image tag
# defaults to the same version.
MOCK_IMAGE_REPOSITORY = "glm53/mock"
MOCK_IMAGE_TAG = __version__
# Defaults of the options (the command line shows them in --help).
DEFAULT_CLUSTER = "glm53-smoke"
DEFAULT_NAMESPACE = "glm53-smoke"
DEFAULT_READY_TIMEOUT_S = 600.0
DEFAULT_LOCAL_PORT = 18000
DEFAULT_ARTIFACTS = PurePath("artifacts/kind-smoke")
# vLLM's API port inside the pod (the Service forwards it); the validation run talks to it through a port-forward.
VLLM_PORT = 8000
# Containers the pod must have: the LMCache native sidecar and the engine (contracts: pod layout).
SIDECAR_CONTAINER = "lmcache"
ENGINE_CONTAINER = "vllm"
# Repository paths the run needs (relative to the repository root, where the shell entry point runs it).
CHART_DIR = "charts/glm53"
# The chart's name (charts/glm53/Chart.yaml), which `glm53.fullname` looks for in the release name.
CHART_NAME = "glm53"
BUILD_PLAYBOOK = "ansible/build-images.yml"
# Labels the chart puts on the serving pod (selector labels: instance = release, component = engine).
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
ENGINE_COMPONENT = "engine"
# ansible/ansible.cfg sets the inventory and roles path; it is read only from the working directory or this variable.
ANSIBLE_ENV = (("ANSIBLE_CONFIG", "ansible/ansible.cfg"),)

_VERSION = re.compile(r"v?(\d{1,6})\.(\d{1,6})(?:\.(\d{1,6}))?")
_NODE_TAG = re.compile(r"^kindest/node:v(\d{1,4})\.(\d{1,4})\.(\d{1,4})@sha256:[0-9a-f]{64}$")


def parse_version(text: str) -> Version | None:
    """The first `major.minor[.patch]` in a tool's version output (`Docker version 28.2.2, build ...` -> 28.2.2)."""
    match = _VERSION.search(text)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def format_version(version: Version) -> str:
    return ".".join(str(part) for part in version)


def node_image_kubernetes(image: str) -> Version | None:
    """The Kubernetes version a digest-pinned `kindest/node:vX.Y.Z@sha256:...` reference names, else None."""
    match = _NODE_TAG.match(image)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


# ---------------------------------------------------------------------------------------------------------- preflight


@dataclass(frozen=True)
class ToolRequirement:
    """A command-line tool the smoke test drives, how to ask its version, and the oldest version that works."""

    name: str
    version_argv: tuple[str, ...]
    minimum: Version
    why: str
    install: str


@dataclass(frozen=True)
class ToolProbe:
    """What asking a tool for its version produced: not on PATH, a failed command, or its output."""

    found: bool
    output: str = ""
    failed: bool = False


def tool_requirements(node_image: str = NODE_IMAGE) -> tuple[ToolRequirement, ...]:
    """The minimum versions, as data; kubectl's follows the node image's Kubernetes version (supported skew)."""
    node = node_image_kubernetes(node_image) or MIN_NODE_KUBERNETES
    kubectl_minimum = (node[0], max(node[1] - KUBECTL_SKEW, 0), 0)
    return (
        ToolRequirement(
            "docker",
            ("docker", "--version"),
            (20, 10, 0),
            "kind's node containers need a cgroup v2-aware Docker Engine",
            "https://docs.docker.com/engine/install/",
        ),
        ToolRequirement(
            "kind",
            ("kind", "version"),
            KIND_RELEASE,
            f"the pinned node image is built for kind v{format_version(KIND_RELEASE)}",
            "https://kind.sigs.k8s.io/docs/user/quick-start/#installation",
        ),
        ToolRequirement(
            "kubectl",
            ("kubectl", "version", "--client"),
            kubectl_minimum,
            f"kubectl must be within {KUBECTL_SKEW} minor version of the node's Kubernetes {format_version(node)}",
            "https://kubernetes.io/docs/tasks/tools/",
        ),
        ToolRequirement(
            "ansible-playbook",
            ("ansible-playbook", "--version"),
            (2, 19, 0),
            "the image playbook is linted and tested with ansible-core 2.19",
            "bash scripts/setup.d/31-ansible.sh installs it into .tools/bin",
        ),
        ToolRequirement(
            "helm",
            ("helm", "version", "--short"),
            (3, 10, 0),
            "the chart is linted and rendered with Helm 3.10 in CI (scripts/setup.d/20-helm.sh)",
            "https://helm.sh/docs/intro/install/",
        ),
    )


# Asked only once the docker client passed: is the daemon reachable by this user?
DOCKER_DAEMON_ARGV = ("docker", "info", "--format", "{{.ServerVersion}}")


def judge_tool(requirement: ToolRequirement, probe: ToolProbe) -> tuple[bool, str]:
    """(ok, one line) for one tool: found and new enough, or what is wrong and what to do."""
    name, need = requirement.name, format_version(requirement.minimum)
    if not probe.found:
        return False, f"{name} not found on PATH; install {name} >= {need} ({requirement.install})"
    first_line = probe.output.strip().splitlines()[0] if probe.output.strip() else ""
    version = None if probe.failed else parse_version(first_line)
    if version is None:
        command = shlex.join(requirement.version_argv)
        return False, (
            f"could not read {name}'s version from `{command}` (got {first_line[:80]!r}); "
            f"install {name} >= {need} ({requirement.install})"
        )
    if version < requirement.minimum:
        return False, (
            f"{name} {format_version(version)} is too old; need >= {need} because {requirement.why} "
            f"({requirement.install})"
        )
    return True, f"{name} {format_version(version)} ok (>= {need})"


def judge_docker_daemon(probe: ToolProbe) -> tuple[bool, str]:
    """(ok, one line) for the Docker daemon behind the client."""
    if probe.failed or not probe.output.strip():
        detail = probe.output.strip().splitlines()[-1][:120] if probe.output.strip() else "no output"
        return False, (
            f"docker is installed but its daemon is not reachable (`docker info` said: {detail}); "
            "start Docker or give this user access to its socket"
        )
    return True, f"docker daemon {probe.output.strip().splitlines()[0]} reachable"


def judge_node_image(image: str) -> tuple[bool, str]:
    """(ok, one line) for the kind node image: digest-pinned kindest/node of Kubernetes >= 1.29."""
    need = format_version(MIN_NODE_KUBERNETES)
    version = node_image_kubernetes(image)
    if version is None:
        return False, (
            f"node image {image!r} is not a digest-pinned kindest/node:vX.Y.Z@sha256:<digest> reference; "
            f"pick one from your kind release's notes (default {NODE_IMAGE})"
        )
    if version < MIN_NODE_KUBERNETES:
        return False, (
            f"node image Kubernetes {format_version(version)} is too old; need >= {need} for native sidecars "
            f"(default {NODE_IMAGE})"
        )
    return True, f"node image {image} (Kubernetes {format_version(version)}) ok (>= {need})"


# --------------------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class SmokeOptions:
    """Everything a run depends on; the plan is a function of these alone."""

    profile: ModelProfile
    # The chart's mock.engine: `standin`, or `vllm`, the mock image's real CPU engine on the profile's tiny model.
    engine: str = "standin"
    cluster: str = DEFAULT_CLUSTER
    namespace: str = DEFAULT_NAMESPACE
    reuse: bool = False
    keep: bool = False
    node_image: str = NODE_IMAGE
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    local_port: int = DEFAULT_LOCAL_PORT
    artifacts: PurePath = DEFAULT_ARTIFACTS

    @property
    def release(self) -> str:
        """The Helm release is named after the profile, as in the quickstart (`glm53-flash`, `glm53`); a tiny
        profile's release carries the chart's name in front (`glm53-tiny-dense`), because the chart's full name, and
        so its Service, is the release name only when that contains the chart name (`glm53.fullname`)."""
        name = self.profile.name
        return name if CHART_NAME in name else f"{CHART_NAME}-{name}"

    @property
    def context(self) -> str:
        """kind names the kubeconfig context `kind-<cluster>`; every command pins it so no other cluster is touched."""
        return f"kind-{self.cluster}"

    @property
    def mock_image(self) -> str:
        return f"{MOCK_IMAGE_REPOSITORY}:{MOCK_IMAGE_TAG}"


@dataclass(frozen=True)
class Run:
    """Run one process from the repository root, with `env` added to the environment; a non-zero exit fails `phase`.

    A step with `needs` runs only if the run got as far as starting that phase (a teardown uninstalls only a release
    whose install was attempted).
    """

    phase: Phase
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    needs: Phase | None = None

    @property
    def title(self) -> str:
        return shlex.join(self.argv)

    def describe(self) -> list[str]:
        command = shlex.join([*(f"{key}={value}" for key, value in self.env), *self.argv])
        return [command if self.needs is None else f"{command}  # only if the {self.needs.label} step ran"]


@dataclass(frozen=True)
class Preflight:
    """Ask every tool its version and check the node image; nothing changes on the machine."""

    requirements: tuple[ToolRequirement, ...]
    node_image: str
    phase: Phase = Phase.PREFLIGHT

    @property
    def title(self) -> str:
        return f"check {', '.join(r.name for r in self.requirements)} and the node image"

    def describe(self) -> list[str]:
        lines = [
            f"{shlex.join(r.version_argv)}  # need {r.name} >= {format_version(r.minimum)}" for r in self.requirements
        ]
        lines.append(f"{shlex.join(DOCKER_DAEMON_ARGV)}  # the daemon must be reachable")
        lines.append(f"# node image {self.node_image} must be Kubernetes >= {format_version(MIN_NODE_KUBERNETES)}")
        return lines


@dataclass(frozen=True)
class EnsureCluster:
    """Create the named kind cluster; with `reuse` an existing one of that name is kept, without it one is an error."""

    name: str
    node_image: str
    reuse: bool
    phase: Phase = Phase.CLUSTER

    @property
    def title(self) -> str:
        return f"kind cluster {self.name!r}" + (" (reuse if present)" if self.reuse else "")

    @property
    def create_argv(self) -> tuple[str, ...]:
        return ("kind", "create", "cluster", "--name", self.name, "--image", self.node_image, "--wait", "120s")

    @property
    def export_argv(self) -> tuple[str, ...]:
        return ("kind", "export", "kubeconfig", "--name", self.name)

    def describe(self) -> list[str]:
        if self.reuse:
            condition = f"# only if `kind get clusters` does not list {self.name!r} (--reuse keeps an existing one)"
        else:
            condition = f"# fails first if `kind get clusters` already lists {self.name!r} (pass --reuse to keep it)"
        return ["kind get clusters", f"{shlex.join(self.create_argv)}  {condition}", shlex.join(self.export_argv)]


@dataclass(frozen=True)
class WaitReady:
    """Watch the release's serving pod through the Kubernetes API until Ready, printing each milestone reached."""

    context: str
    namespace: str
    release: str
    timeout_s: float
    phase: Phase = Phase.READY

    @property
    def title(self) -> str:
        return f"wait up to {self.timeout_s:g}s for the serving pod of {self.release} to become Ready"

    @property
    def selector(self) -> str:
        return f"{INSTANCE_LABEL}={self.release},{COMPONENT_LABEL}={ENGINE_COMPONENT}"

    def describe(self) -> list[str]:
        milestones = ", ".join(label for label, _ in MILESTONES)
        return [
            f"# watch pods -l {self.selector} in {self.namespace} (context {self.context}) until Ready, "
            f"timeout {self.timeout_s:g}s; milestones: {milestones}"
        ]


@dataclass(frozen=True)
class ShowGeometry:
    """Read the engine's and the sidecar's container logs and print the cache geometry they agreed on."""

    context: str
    namespace: str
    release: str
    profile: ModelProfile
    phase: Phase = Phase.READY

    @property
    def title(self) -> str:
        return "the cache geometry the containers logged"

    def describe(self) -> list[str]:
        return [
            f"# read the {ENGINE_CONTAINER!r} and {SIDECAR_CONTAINER!r} container logs of the serving pod and print "
            f"the parsed geometry (expected for {self.profile.name}: {expected_geometry_text(self.profile)})"
        ]


@dataclass(frozen=True)
class PortForwardValidate:
    """Forward a local port to the Service, then run `glm53 validate` against it; the forward ends with the step."""

    forward_argv: tuple[str, ...]
    validate_argv: tuple[str, ...]
    local_port: int
    phase: Phase = Phase.VALIDATE

    @property
    def title(self) -> str:
        return f"{shlex.join(self.validate_argv)} through a port-forward"

    def describe(self) -> list[str]:
        return [f"{shlex.join(self.forward_argv)} &", shlex.join(self.validate_argv), "# stop the port-forward"]


Step = Run | Preflight | EnsureCluster | WaitReady | ShowGeometry | PortForwardValidate


@dataclass(frozen=True)
class Plan:
    """The steps of a run in order, and the teardown that follows them (empty with --keep)."""

    steps: tuple[Step, ...]
    teardown: tuple[Run, ...]
    artifacts: PurePath


def helm_install_argv(options: SmokeOptions) -> tuple[str, ...]:
    """The install command: the quickstart's, plus the mock, the in-cluster validation and the locally built image."""
    argv = ["helm", "install", options.release, CHART_DIR, "--set", "mock.enabled=true"]
    argv += ["--set", "validation.enabled=true"]
    if options.profile.name != DEFAULT_PROFILE:
        argv += ["--set", f"profile={options.profile.name}"]
    if options.engine != "standin":
        argv += ["--set", f"mock.engine={options.engine}"]
    # The image was side-loaded into the node, never pushed: `Never` turns a failed load into ErrImageNeverPull at once.
    argv += ["--set", f"mock.image.repository={MOCK_IMAGE_REPOSITORY}", "--set", f"mock.image.tag={MOCK_IMAGE_TAG}"]
    argv += ["--set", "mock.image.pullPolicy=Never"]
    # The mock loads no weights: an emptyDir instead of the default 1 TiB claim (which the chart keeps on uninstall).
    argv += ["--set", "weights.source=none"]
    argv += ["--namespace", options.namespace, "--create-namespace", "--kube-context", options.context]
    return tuple(argv)


# Only the CPU mock image. JSON, because `-e glm53_images=[mock]` would hand the role the string "[mock]", not a list.
BUILD_MOCK_ARGV = ("ansible-playbook", BUILD_PLAYBOOK, "-e", '{"glm53_images": ["mock"]}')


def helm_target(options: SmokeOptions) -> tuple[str, ...]:
    """The flags that pin a Helm command to the kind cluster and the release's namespace."""
    return ("--kube-context", options.context, "--namespace", options.namespace)


def service_name(options: SmokeOptions) -> str:
    """The chart's Service: its full name, which is the release name when that contains the chart name (both do)."""
    return options.release


def preflight_step(options: SmokeOptions) -> Preflight:
    """The first step of every run, and all of `--preflight-only`."""
    return Preflight(tool_requirements(options.node_image), options.node_image)


def build_plan(options: SmokeOptions) -> Plan:
    """Every step of a run, in order. The dry run prints this; the real run executes it."""
    steps: tuple[Step, ...] = (
        preflight_step(options),
        EnsureCluster(options.cluster, options.node_image, options.reuse),
        Run(Phase.IMAGE, BUILD_MOCK_ARGV, ANSIBLE_ENV),
        Run(Phase.IMAGE, ("kind", "load", "docker-image", options.mock_image, "--name", options.cluster)),
        Run(Phase.INSTALL, helm_install_argv(options)),
        WaitReady(options.context, options.namespace, options.release, options.ready_timeout_s),
        ShowGeometry(options.context, options.namespace, options.release, options.profile),
        Run(Phase.HELM_TEST, ("helm", "test", options.release, "--logs", "--timeout", "10m", *helm_target(options))),
        PortForwardValidate(
            forward_argv=(
                "kubectl",
                "--context",
                options.context,
                "--namespace",
                options.namespace,
                "port-forward",
                "--address",
                "127.0.0.1",
                f"service/{service_name(options)}",
                f"{options.local_port}:{VLLM_PORT}",
            ),
            validate_argv=(
                "glm53",
                "validate",
                "--base-url",
                f"http://127.0.0.1:{options.local_port}",
                "--profile",
                options.profile.name,
            ),
            local_port=options.local_port,
        ),
    )
    return Plan(steps, teardown_steps(options), options.artifacts)


def teardown_steps(options: SmokeOptions) -> tuple[Run, ...]:
    """Nothing with --keep; a reused cluster outlives the run (only the release goes); otherwise the cluster goes."""
    if options.keep:
        return ()
    if options.reuse:
        uninstall = ("helm", "uninstall", options.release, "--wait", *helm_target(options))
        return (Run(Phase.TEARDOWN, uninstall, needs=Phase.INSTALL),)
    return (Run(Phase.TEARDOWN, ("kind", "delete", "cluster", "--name", options.cluster)),)


def describe_plan(plan: Plan, keep: bool) -> list[str]:
    """The dry run's output: every command or step, numbered in order, then what happens on failure and at the end."""
    lines: list[str] = []
    for number, step in enumerate(plan.steps, start=1):
        lines.append(f"[{number}] {step.phase.label} (exit {step.phase.exit_code} on failure)")
        lines += [f"    {line}" for line in step.describe()]
    lines.append(f"on failure: collect describe, events and the logs of every container into {plan.artifacts}/")
    if plan.teardown:
        lines.append("teardown (always, also after a failure):")
        lines += [f"    {line}" for step in plan.teardown for line in step.describe()]
    else:
        lines.append("teardown: skipped (--keep)" if keep else "teardown: none")
    return lines


# -------------------------------------------------------------------------------------------------------- readiness


def _condition(pod: KubeObject, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in pod.get("status", {}).get("conditions") or ()
    )


def _container_status(pod: KubeObject, name: str) -> KubeObject:
    status = pod.get("status", {})
    for entry in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        if entry.get("name") == name:
            return dict(entry)
    return {}


# Milestones of the serving pod in the order they happen, each a predicate over the pod as the API returns it.
MILESTONES: tuple[tuple[str, Callable[[KubeObject], bool]], ...] = (
    ("scheduled", lambda pod: _condition(pod, "PodScheduled")),
    (
        f"sidecar {SIDECAR_CONTAINER} started",
        lambda pod: bool(_container_status(pod, SIDECAR_CONTAINER).get("started")),
    ),
    (
        f"{ENGINE_CONTAINER} running",
        lambda pod: "running" in (_container_status(pod, ENGINE_CONTAINER).get("state") or {}),
    ),
    ("startup probe passed", lambda pod: bool(_container_status(pod, ENGINE_CONTAINER).get("started"))),
    ("Ready", lambda pod: _condition(pod, "Ready")),
)

# Waiting reasons that do not resolve by themselves: report at once instead of running into the timeout.
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def is_serving_pod(pod: KubeObject) -> bool:
    """The release's serving pod has the engine container; helm-test and validation pods do not."""
    return any(c.get("name") == ENGINE_CONTAINER for c in pod.get("spec", {}).get("containers") or ())


def reached_milestones(pod: KubeObject) -> list[str]:
    """The milestones this pod has reached, in order."""
    return [label for label, reached in MILESTONES if reached(pod)]


def pod_failure(pod: KubeObject) -> str | None:
    """Why the pod cannot become Ready on its own (a stuck container or a restart), or None while it still can."""
    name = pod.get("metadata", {}).get("name", "?")
    if pod.get("status", {}).get("phase") == "Failed":
        return f"pod {name} failed: {pod.get('status', {}).get('message') or pod.get('status', {}).get('reason')}"
    status = pod.get("status", {})
    for entry in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        waiting = (entry.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return f"container {entry.get('name')} of pod {name} is stuck in {waiting['reason']}{detail}"
        if entry.get("restartCount", 0) > 0:
            last = (entry.get("lastState") or {}).get("terminated") or {}
            return (
                f"container {entry.get('name')} of pod {name} restarted {entry['restartCount']} time(s) "
                f"(last exit code {last.get('exitCode', '?')}, reason {last.get('reason', '?')}); "
                "a failed startup probe restarts the engine"
            )
    return None


def pending_summary(pod: KubeObject) -> str:
    """Where a pod stands, for the timeout message: milestones reached and the scheduler's or kubelet's last word."""
    reached = reached_milestones(pod)
    missing = [label for label, _ in MILESTONES if label not in reached]
    notes = [
        f"{c.get('reason')}: {c.get('message')}"
        for c in pod.get("status", {}).get("conditions") or ()
        if c.get("status") != "True" and c.get("message")
    ]
    name = pod.get("metadata", {}).get("name", "?")
    text = f"pod {name} reached [{', '.join(reached) or 'nothing'}], not [{', '.join(missing)}]"
    return f"{text} ({'; '.join(notes)})" if notes else text


class ReadinessTracker:
    """Turns a stream of pod snapshots into one progress line per milestone, with its duration and the total."""

    def __init__(self, start: float) -> None:
        self._start = start
        self._last = start
        self._seen: dict[str, set[str]] = {}
        self.latest: dict[str, KubeObject] = {}

    def observe(self, pod: KubeObject, now: float) -> list[str]:
        """Progress lines for milestones first reached in this snapshot (raises nothing: see `pod_failure`)."""
        name = pod.get("metadata", {}).get("name", "?")
        self.latest[name] = pod
        seen = self._seen.setdefault(name, set())
        lines = []
        for label in reached_milestones(pod):
            if label in seen:
                continue
            seen.add(label)
            lines.append(f"{name}: {label} (+{now - self._last:.1f}s, {now - self._start:.1f}s total)")
            self._last = now
        return lines

    def ready(self) -> bool:
        return any(_condition(pod, "Ready") for pod in self.latest.values())


# --------------------------------------------------------------------------------------------------------- geometry


def expected_geometry_text(profile: ModelProfile) -> str:
    n = profile.unified_block_size(profile.tensor_parallel_size)
    if profile.follows_unified_block_size and n is None:
        return f"N not measured at TP {profile.tensor_parallel_size}"
    groups = profile.expected_groups(n)
    return f"group_tokens_per_block={list(groups)} at TP {profile.tensor_parallel_size}"


# Records that mean the start went wrong; run boundaries (RunStarted, EngineProcess) are bookkeeping for the probe.
_PROBLEMS = (ChunkSizeRejected, ServerUnreachable, EngineDied, MalformedLine)


def _problem_text(record: Record) -> str:
    if isinstance(record, ChunkSizeRejected):
        return (
            f"the connector refused chunk size {record.chunk_size} (must be a multiple of {record.required_multiple})"
        )
    if isinstance(record, ServerUnreachable):
        return f"vLLM cannot reach the LMCache server at {record.url}"
    if isinstance(record, EngineDied):
        return f"vLLM's engine died ({record.reason})"
    if isinstance(record, MalformedLine):
        return f"unparseable {record.kind} line: {record.text[:120]}"
    return str(record)


def geometry_lines(records: Iterable[Record], profile: ModelProfile) -> list[str]:
    """What the logs say about the cache geometry, one line per distinct fact, compared with the profile."""
    n = profile.unified_block_size(profile.tensor_parallel_size)
    expected = None if profile.follows_unified_block_size and n is None else profile.expected_groups(n)
    lines: list[str] = []
    for record in records:
        if isinstance(record, ResolvedGeometry):
            verdict = "as expected" if record.group_tokens_per_block == expected else f"expected {list(expected or ())}"
            line = (
                f"geometry: group_tokens_per_block={list(record.group_tokens_per_block)}, "
                f"scheduler_block_size={record.scheduler_block_size} ({verdict})"
            )
        elif isinstance(record, AttentionBlockSize):
            line = f"unified block size N = {record.tokens} tokens" + (
                f" (expected {n})" if n not in (None, record.tokens) else ""
            )
        elif isinstance(record, NegotiatedChunk):
            line = f"negotiated chunk size {record.resolved} (configured_min={record.configured_min})"
        elif isinstance(record, _PROBLEMS):
            line = f"problem: {_problem_text(record)}"
        else:
            continue
        if line not in lines:
            lines.append(line)
    return lines or ["geometry: no geometry line in the engine's log yet"]


# -------------------------------------------------------------------------------------------------------- artifacts


class ClusterReader(Protocol):
    """The read-only view of a namespace the artifact collection needs (the real one wraps the Kubernetes client)."""

    def pods(self, namespace: str) -> list[KubeObject]: ...

    def events(self, namespace: str) -> list[KubeObject]: ...

    def log(self, namespace: str, pod: str, container: str, previous: bool) -> str: ...


@dataclass(frozen=True)
class Artifact:
    """One file of the failure report, relative to the artifacts folder."""

    path: PurePath
    text: str


def containers_of(pod: KubeObject) -> list[tuple[str, int]]:
    """Every container of a pod (init containers, native sidecars included, first) with its restart count."""
    spec, status = pod.get("spec", {}), pod.get("status", {})
    restarts = {
        entry.get("name"): entry.get("restartCount", 0)
        for entry in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
    }
    names = [c["name"] for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]]
    return [(name, int(restarts.get(name, 0))) for name in names]


def _event_time(event: KubeObject) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def render_events(events: Sequence[KubeObject], involving: str | None = None) -> str:
    """Events oldest first, like `kubectl get events`; only those of one object when `involving` names it."""
    rows = []
    for event in sorted(events, key=_event_time):
        obj = event.get("involvedObject", {})
        if involving is not None and obj.get("name") != involving:
            continue
        rows.append(
            f"{_event_time(event)}  {event.get('type', '')}  {event.get('reason', '')}  "
            f"{obj.get('kind', '')}/{obj.get('name', '')}  x{event.get('count') or 1}  "
            f"{' '.join(str(event.get('message', '')).split())}"
        )
    return "\n".join(rows) + "\n" if rows else "(no events)\n"


def render_describe(pod: KubeObject, events: Sequence[KubeObject]) -> str:
    """A `kubectl describe pod`-like summary: phase, conditions, every container's state and probes, then events."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    lines = [
        f"Name:       {meta.get('name')}",
        f"Namespace:  {meta.get('namespace')}",
        f"Node:       {spec.get('nodeName')}",
        f"Phase:      {status.get('phase')}",
        "Conditions:",
    ]
    lines += [
        f"  {c.get('type')}={c.get('status')} {c.get('reason') or ''} {c.get('message') or ''}".rstrip()
        for c in status.get("conditions") or ()
    ]
    specs = {c["name"]: c for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]}
    for name, restarts in containers_of(pod):
        container, state = specs[name], _container_status(pod, name)
        kind = "init/sidecar" if container in (spec.get("initContainers") or ()) else "container"
        lines.append(f"Container {name} ({kind}): image {container.get('image')}")
        lines.append(f"  state: {state.get('state')}  ready={state.get('ready')}  started={state.get('started')}")
        lines.append(f"  restarts: {restarts}  last state: {state.get('lastState')}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                lines.append(f"  {probe}: {container[probe]}")
    lines.append("Events:")
    lines.append(render_events(events, involving=meta.get("name")).rstrip("\n"))
    return "\n".join(lines) + "\n"


def collect_artifacts(reader: ClusterReader, namespace: str) -> list[Artifact]:
    """Describe, events and every container's log (the previous one too after a restart) of every pod in `namespace`.

    A log that cannot be read (container never started) becomes a file saying why, so the report is never partial.
    """
    pods, events = reader.pods(namespace), reader.events(namespace)
    artifacts = [Artifact(PurePath("events.txt"), render_events(events))]
    for pod in pods:
        name = str(pod.get("metadata", {}).get("name", "unknown"))
        folder = PurePath(name)
        artifacts.append(Artifact(folder / "describe.txt", render_describe(pod, events)))
        for container, restarts in containers_of(pod):
            for previous in (False, True) if restarts else (False,):
                suffix = ".previous.log" if previous else ".log"
                try:
                    text = reader.log(namespace, name, container, previous)
                except Exception as error:  # any client or HTTP failure: record it instead of losing the report
                    text = f"(could not read the log of container {container}: {' '.join(str(error).split())})\n"
                artifacts.append(Artifact(folder / f"{container}{suffix}", text))
    return artifacts
