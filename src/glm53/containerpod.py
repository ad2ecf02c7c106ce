"""Read the chart's rendered pod as Docker container settings: the input of CI's container-level pod.

Why: CI has a Docker engine but no Kubernetes. Running the chart's own containers — command and arguments, environment,
security context, volumes and exec probes, read from the rendered Deployment instead of re-typed — in one shared network
namespace tests what the chart would make a kubelet do, and a chart change reaches the test without touching it. Pure:
rendered objects in, frozen records out; the caller makes the Docker calls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from glm53.errors import EXIT_FAILURE, Glm53Error

# Kubernetes quantity suffixes (resource.Quantity): binary and decimal multipliers.
_QUANTITY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")
# Kubernetes defaults of probe timing, used when the rendered probe leaves them out.
_PROBE_DEFAULTS = {"periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 3}


@dataclass(frozen=True)
class ExecProbe:
    """An exec probe: the command the kubelet runs inside the container, and how long it keeps trying."""

    command: tuple[str, ...]
    period_s: float
    timeout_s: float
    failure_threshold: int

    @property
    def budget_s(self) -> float:
        """How long the kubelet keeps probing before it gives up on the container."""
        return self.period_s * self.failure_threshold


@dataclass(frozen=True)
class VolumeMount:
    """One of a container's volume mounts."""

    volume: str
    path: str
    read_only: bool


@dataclass(frozen=True)
class PodVolume:
    """A pod volume as the container pod provides it: in memory (emptyDir medium Memory) or a fresh empty volume."""

    name: str
    in_memory: bool
    size_bytes: int | None


@dataclass(frozen=True)
class PodContainer:
    """A rendered container, as the settings a container engine needs to run it the way the kubelet would.

    `argv` is the rendered `command` followed by `args`. As in Kubernetes, a container without `command` keeps its
    image's ENTRYPOINT (the images' `tini -- glm53 supervise`) and `argv` is then only what follows it:
    `overrides_entrypoint` says which.
    """

    name: str
    image: str
    argv: tuple[str, ...]
    overrides_entrypoint: bool
    env: tuple[tuple[str, str], ...]
    user: str | None
    read_only_root: bool
    cap_drop: tuple[str, ...]
    no_new_privileges: bool
    memory_limit_bytes: int | None
    nano_cpus: int | None
    mounts: tuple[VolumeMount, ...]
    startup_probe: ExecProbe | None
    readiness_probe: ExecProbe | None
    sidecar: bool


@dataclass(frozen=True)
class RenderedPod:
    """A rendered pod: its containers in the kubelet's start order (native sidecars first) and its volumes."""

    name: str
    containers: tuple[PodContainer, ...]
    volumes: tuple[PodVolume, ...]

    def container(self, name: str) -> PodContainer:
        """The container called `name`, or an error listing the ones the pod has."""
        for container in self.containers:
            if container.name == name:
                return container
        names = ", ".join(c.name for c in self.containers)
        raise Glm53Error(
            f"expected a container {name!r} in pod {self.name!r}, found only {names}; check the chart values",
            EXIT_FAILURE,
        )


def parse_quantity(quantity: str | int | float) -> float:
    """The value of a Kubernetes quantity (`500m` -> 0.5, `256Mi` -> 268435456, `2` -> 2)."""
    if isinstance(quantity, int | float):
        return float(quantity)
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise Glm53Error(
            f"expected a Kubernetes quantity such as 500m or 256Mi, found {quantity!r}; fix the chart values",
            EXIT_FAILURE,
        )
    return float(match.group(1)) * _QUANTITY_SUFFIXES[match.group(2)]


def _exec_probe(spec: Mapping[str, Any] | None) -> ExecProbe | None:
    if spec is None or "exec" not in spec:
        return None
    timing = {key: spec.get(key, default) for key, default in _PROBE_DEFAULTS.items()}
    return ExecProbe(
        command=tuple(str(part) for part in spec["exec"]["command"]),
        period_s=float(timing["periodSeconds"]),
        timeout_s=float(timing["timeoutSeconds"]),
        failure_threshold=int(timing["failureThreshold"]),
    )


def _env(container: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for entry in container.get("env", []):
        if "value" not in entry:
            raise Glm53Error(
                f"expected literal env values in container {container['name']!r}, found {entry['name']} from "
                f"{', '.join(sorted(set(entry) - {'name'}))}; the container pod supports `value` entries only",
                EXIT_FAILURE,
            )
        pairs.append((str(entry["name"]), str(entry["value"])))
    return tuple(pairs)


def _user(security: Mapping[str, Any]) -> str | None:
    if "runAsUser" not in security:
        return None
    group = security.get("runAsGroup")
    return f"{security['runAsUser']}:{group}" if group is not None else str(security["runAsUser"])


def _container(spec: Mapping[str, Any], pod_security: Mapping[str, Any], sidecar: bool) -> PodContainer:
    security = {**pod_security, **spec.get("securityContext", {})}
    limits = spec.get("resources", {}).get("limits", {})
    return PodContainer(
        name=str(spec["name"]),
        image=str(spec["image"]),
        argv=tuple(str(part) for part in [*spec.get("command", []), *spec.get("args", [])]),
        overrides_entrypoint="command" in spec,
        env=_env(spec),
        user=_user(security),
        read_only_root=bool(security.get("readOnlyRootFilesystem", False)),
        cap_drop=tuple(security.get("capabilities", {}).get("drop", [])),
        no_new_privileges=security.get("allowPrivilegeEscalation") is False,
        memory_limit_bytes=int(parse_quantity(limits["memory"])) if "memory" in limits else None,
        nano_cpus=int(parse_quantity(limits["cpu"]) * 1e9) if "cpu" in limits else None,
        mounts=tuple(
            VolumeMount(volume=str(m["name"]), path=str(m["mountPath"]), read_only=bool(m.get("readOnly", False)))
            for m in spec.get("volumeMounts", [])
        ),
        startup_probe=_exec_probe(spec.get("startupProbe")),
        readiness_probe=_exec_probe(spec.get("readinessProbe")),
        sidecar=sidecar,
    )


def _volume(spec: Mapping[str, Any]) -> PodVolume:
    empty_dir = spec.get("emptyDir")
    in_memory = empty_dir is not None and empty_dir.get("medium") == "Memory"
    size = empty_dir.get("sizeLimit") if empty_dir is not None else None
    return PodVolume(
        name=str(spec["name"]), in_memory=in_memory, size_bytes=int(parse_quantity(size)) if size else None
    )


def pod_from_spec(name: str, pod_spec: Mapping[str, Any]) -> RenderedPod:
    """The pod described by a PodSpec: native sidecars (init containers with restartPolicy Always) start first.

    Plain init containers (run-to-completion) are refused: the container pod would have to wait for them, and the chart
    has none.
    """
    pod_security = {
        key: value for key, value in pod_spec.get("securityContext", {}).items() if key in {"runAsUser", "runAsGroup"}
    }
    init = list(pod_spec.get("initContainers", []))
    plain_init = [c["name"] for c in init if c.get("restartPolicy") != "Always"]
    if plain_init:
        raise Glm53Error(
            f"expected only native sidecars among the init containers of {name!r}, found run-to-completion "
            f"{', '.join(plain_init)}; the container pod does not run those",
            EXIT_FAILURE,
        )
    containers = [_container(c, pod_security, sidecar=True) for c in init]
    containers += [_container(c, pod_security, sidecar=False) for c in pod_spec.get("containers", [])]
    volumes = tuple(_volume(v) for v in pod_spec.get("volumes", []))
    return RenderedPod(name=name, containers=tuple(containers), volumes=volumes)


def find_object(objects: Iterable[Mapping[str, Any]], kind: str, name: str | None = None) -> Mapping[str, Any]:
    """The one rendered object of `kind` (and `name`, when given), or an error naming what was rendered."""
    matches = [o for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]
    if len(matches) != 1:
        wanted = f"{kind} {name}" if name else kind
        raise Glm53Error(
            f"expected exactly one {wanted} in the rendered chart, found {len(matches)}; check the values", EXIT_FAILURE
        )
    return matches[0]


def deployment_pod(objects: Iterable[Mapping[str, Any]]) -> RenderedPod:
    """The serving pod of the rendered chart (its one Deployment's pod template)."""
    deployment = find_object(objects, "Deployment")
    return pod_from_spec(str(deployment["metadata"]["name"]), deployment["spec"]["template"]["spec"])


def helm_test_pods(objects: Iterable[Mapping[str, Any]]) -> tuple[RenderedPod, ...]:
    """The rendered `helm test` pods (annotation helm.sh/hook: test), in render order."""
    return tuple(
        pod_from_spec(str(o["metadata"]["name"]), o["spec"])
        for o in objects
        if o.get("kind") == "Pod" and o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    )
