"""Plan a kind-cluster smoke test of the chart in CPU-mock mode: its options, phases and exit codes, and its steps.

Why: the plan is a list of typed steps built from the options alone, so `--dry-run` prints exactly what a real run
executes, and the tests assert it in detail without Docker or Kubernetes. Each phase owns the exit code that tells a
person which part failed. Nothing here runs anything: `glm53.pod.kind.run` executes the steps.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass
from pathlib import PurePath

from glm53 import __version__
from glm53.pod.contract import (
    CHART_NAME,
    COMPONENT_LABEL,
    ENGINE_COMPONENT,
    ENGINE_CONTAINER,
    INSTANCE_LABEL,
    SIDECAR_CONTAINER,
)
from glm53.pod.kind.preflight import (
    DOCKER_DAEMON_ARGV,
    MIN_NODE_KUBERNETES,
    NODE_IMAGE,
    ToolRequirement,
    format_version,
    tool_requirements,
)
from glm53.pod.kind.verdicts import MILESTONES, expected_geometry_text
from glm53.profiles import DEFAULT_PROFILE, ModelProfile


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
# Repository paths the run needs (relative to the repository root, where the shell entry point runs it).
CHART_DIR = f"charts/{CHART_NAME}"
BUILD_PLAYBOOK = "ansible/build-images.yml"
# ansible/ansible.cfg sets the inventory and roles path; it is read only from the working directory or this variable.
ANSIBLE_ENV = (("ANSIBLE_CONFIG", "ansible/ansible.cfg"),)


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
        ShowGeometry(options.namespace, options.release, options.profile),
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
