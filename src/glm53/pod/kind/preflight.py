"""What the smoke test needs of the machine, and whether this machine has it: the preflight's judgement.

Why: a run that dies ten minutes in because kind is too old to boot the pinned node image wastes the person's time, so
every requirement is stated here once, as data (tool, how to ask its version, the oldest that works, why, how to
install), with the pins it follows (the kind release and its digest-pinned node image). The judgements read plain
strings (a tool's version output), so they are pure and tested with the outputs of real tools; asking the tools is
`glm53.pod.kind.run`'s job.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

Version = tuple[int, int, int]

# The kind release whose notes list the node image below, and the image itself. kind supports a node image only with
# the release that built it, and only the digest guarantees that build (a tag can be re-pushed). v1.34.11 is the oldest
# Kubernetes that kind v0.33.0 ships, i.e. the closest to what GPU clusters run, and newer than the 1.29 where native
# sidecars (init containers with `restartPolicy: Always`) are on by default.
KIND_RELEASE: Version = (0, 33, 0)
NODE_IMAGE = "kindest/node:v1.34.11@sha256:44e222ee2132dab25ff87301682f89eb82c7880ea3a1bf543bfe9708fd08d67d"
MIN_NODE_KUBERNETES: Version = (1, 29, 0)
# kubectl is supported within one minor version of the API server.
KUBECTL_SKEW = 1

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
