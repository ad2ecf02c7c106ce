"""The chart's rendered pod as a runnable plan: the one definition of what a CPU pod runs.

Why: the pod is defined once, by the chart (`charts/glm53`, mock mode on CPU). This module turns the rendered
Deployment into frozen records (containers in the kubelet's start order, native sidecars first, each with its command
and arguments, environment, security context, limits, volume mounts and probes, plus the pod's volumes), and the
runners execute them without re-typing a flag: `glm53.pod.loopback` as processes on 127.0.0.1 (the README's main job and
`glm53 fleet`), the container-level pod test as Docker containers sharing one network namespace, and the kubelet itself
on kind. Pure: rendered objects in, records out; rendering is `glm53.pod.chart`, running is the runners'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.pod.contract import COMPONENT_LABEL, ENGINE_COMPONENT, SIDECAR_CONTAINER, is_lmcache_sidecar

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
class HttpGetProbe:
    """An httpGet probe: the kubelet GETs `path` on the container's `port`; 200-399 passes."""

    path: str
    port: int
    period_s: float
    timeout_s: float
    failure_threshold: int


@dataclass(frozen=True)
class VolumeMount:
    """One of a container's volume mounts."""

    volume: str
    path: str
    read_only: bool


@dataclass(frozen=True)
class PodVolume:
    """A pod volume: an emptyDir (in memory when its medium is Memory), a Secret's keys, or another source a runner
    may refuse."""

    name: str
    empty_dir: bool
    in_memory: bool
    size_bytes: int | None
    # A secret volume's Secret and the file names its items project (the keys' paths); None for other sources.
    secret_name: str | None = None
    secret_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerPort:
    """A declared container port (what a Service or a probe may target)."""

    name: str
    port: int


@dataclass(frozen=True)
class ContainerPlan:
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
    ports: tuple[ContainerPort, ...]
    startup_probe: ExecProbe | None
    readiness_probe: ExecProbe | None
    sidecar: bool
    # A plain init container: it runs to completion, in order, before the next container starts.
    init: bool = False
    # Runs once the startup probe passed, for the container's whole life: failing it restarts the container.
    liveness_probe: ExecProbe | HttpGetProbe | None = None
    # Variables from a Secret's key (`valueFrom.secretKeyRef`): (variable, Secret, key). A runner gives each a value,
    # as the kubelet does from the Secret the operator created.
    secret_env: tuple[tuple[str, str, str], ...] = ()

    @property
    def served_argv(self) -> tuple[str, ...]:
        """The server command `glm53 supervise` runs in this container (what follows its `--`), else the whole argv."""
        if "supervise" in self.argv and "--" in self.argv[self.argv.index("supervise") :]:
            start = self.argv.index("supervise")
            return self.argv[self.argv.index("--", start) + 1 :]
        return self.argv

    def option(self, flag: str) -> str:
        """The value of `flag` in the argv (its last occurrence wins, as in argparse), or an error naming the flag."""
        indexes = [i for i, part in enumerate(self.argv[:-1]) if part == flag]
        if not indexes:
            raise Glm53Error(
                f"expected {flag} in the rendered command of container {self.name!r}; check the chart's helpers",
                EXIT_FAILURE,
            )
        return self.argv[indexes[-1] + 1]

    def port(self, name: str) -> int:
        """The declared container port called `name`, or an error listing the declared ones."""
        for port in self.ports:
            if port.name == name:
                return port.port
        declared = ", ".join(p.name for p in self.ports) or "none"
        raise Glm53Error(
            f"expected a port {name!r} on container {self.name!r}, found {declared}; check the chart", EXIT_FAILURE
        )


@dataclass(frozen=True)
class PodPlan:
    """A rendered pod: its containers in the kubelet's start order (init containers first) and its volumes."""

    name: str
    containers: tuple[ContainerPlan, ...]
    volumes: tuple[PodVolume, ...]
    # terminationGracePeriodSeconds: how long a stop waits between SIGTERM and SIGKILL (Kubernetes' default is 30).
    grace_period_s: float = 30.0
    # The pod's restartPolicy, for its main containers (a native sidecar is restarted always).
    restart_policy: str = "Always"

    def container(self, name: str) -> ContainerPlan:
        """The container called `name`, or an error listing the ones the pod has."""
        for container in self.containers:
            if container.name == name:
                return container
        names = ", ".join(c.name for c in self.containers)
        raise Glm53Error(
            f"expected a container {name!r} in pod {self.name!r}, found only {names}; check the chart values",
            EXIT_FAILURE,
        )

    def lmcache_servers(self) -> tuple[ContainerPlan, ...]:
        """The pod's LMCache sidecars in start order: the one `lmcache`, or one `lmcache-<i>` per TP rank (server i
        serves rank i), each started only after the one before passed its startup probe; an error when it has none."""
        servers = tuple(c for c in self.containers if c.sidecar and is_lmcache_sidecar(c.name))
        if not servers:
            return (self.container(SIDECAR_CONTAINER),)  # raises, naming the containers the pod has
        return servers


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


def _timing(spec: Mapping[str, Any]) -> tuple[float, float, int]:
    timing = {key: spec.get(key, default) for key, default in _PROBE_DEFAULTS.items()}
    return float(timing["periodSeconds"]), float(timing["timeoutSeconds"]), int(timing["failureThreshold"])


def _exec_probe(spec: Mapping[str, Any] | None) -> ExecProbe | None:
    if spec is None or "exec" not in spec:
        return None
    return ExecProbe(tuple(str(part) for part in spec["exec"]["command"]), *_timing(spec))


def _liveness_probe(
    spec: Mapping[str, Any] | None, ports: tuple[ContainerPort, ...]
) -> ExecProbe | HttpGetProbe | None:
    """The liveness probe: exec, or httpGet with its port resolved (a name refers to a declared container port)."""
    if spec is None or "httpGet" not in spec:
        return _exec_probe(spec)
    port = spec["httpGet"]["port"]
    if isinstance(port, str) and not port.isdigit():
        named = [p.port for p in ports if p.name == port]
        if not named:
            raise Glm53Error(
                f"a liveness probe names port {port!r}, which the container does not declare; check the chart",
                EXIT_FAILURE,
            )
        port = named[0]
    return HttpGetProbe(str(spec["httpGet"].get("path", "/")), int(port), *_timing(spec))


def _env(container: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((str(e["name"]), str(e["value"])) for e in _env_entries(container) if "value" in e)


def _secret_env(container: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    refs = [(e["name"], e["valueFrom"]["secretKeyRef"]) for e in _env_entries(container) if "value" not in e]
    return tuple((str(name), str(ref["name"]), str(ref["key"])) for name, ref in refs)


def _env_entries(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The container's env entries, each a literal `value` or a Secret's key; anything else (a field or resource
    reference, a ConfigMap) is refused by name."""
    entries = container.get("env", [])
    for entry in entries:
        if "value" not in entry and set(entry.get("valueFrom", {})) != {"secretKeyRef"}:
            raise Glm53Error(
                f"expected literal env values or Secret keys in container {container['name']!r}, found "
                f"{entry['name']} from {', '.join(sorted(set(entry) - {'name'}))}; a pod plan holds `value` and "
                "`valueFrom.secretKeyRef` entries only",
                EXIT_FAILURE,
            )
    return list(entries)


def _user(security: Mapping[str, Any]) -> str | None:
    if "runAsUser" not in security:
        return None
    group = security.get("runAsGroup")
    return f"{security['runAsUser']}:{group}" if group is not None else str(security["runAsUser"])


def _container(
    spec: Mapping[str, Any], pod_security: Mapping[str, Any], sidecar: bool, init: bool = False
) -> ContainerPlan:
    security = {**pod_security, **spec.get("securityContext", {})}
    limits = spec.get("resources", {}).get("limits", {})
    ports = tuple(
        ContainerPort(name=str(p.get("name", "")), port=int(p["containerPort"])) for p in spec.get("ports", [])
    )
    return ContainerPlan(
        name=str(spec["name"]),
        image=str(spec["image"]),
        argv=tuple(str(part) for part in [*spec.get("command", []), *spec.get("args", [])]),
        overrides_entrypoint="command" in spec,
        env=_env(spec),
        secret_env=_secret_env(spec),
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
        ports=ports,
        startup_probe=_exec_probe(spec.get("startupProbe")),
        readiness_probe=_exec_probe(spec.get("readinessProbe")),
        sidecar=sidecar,
        init=init,
        liveness_probe=_liveness_probe(spec.get("livenessProbe"), ports),
    )


def _volume(spec: Mapping[str, Any]) -> PodVolume:
    empty_dir = spec.get("emptyDir")
    in_memory = empty_dir is not None and empty_dir.get("medium") == "Memory"
    size = empty_dir.get("sizeLimit") if empty_dir is not None else None
    secret = spec.get("secret")
    return PodVolume(
        name=str(spec["name"]),
        empty_dir=empty_dir is not None,
        in_memory=in_memory,
        size_bytes=int(parse_quantity(size)) if size else None,
        secret_name=str(secret["secretName"]) if secret is not None else None,
        secret_paths=tuple(str(item["path"]) for item in secret.get("items", ())) if secret is not None else (),
    )


def pod_from_spec(name: str, pod_spec: Mapping[str, Any]) -> PodPlan:
    """The pod described by a PodSpec, its containers in the kubelet's start order: the init containers as listed
    (a plain one runs to completion before the next starts; a native sidecar, restartPolicy Always, must pass its
    startup probe), then the main containers.
    """
    pod_security = {
        key: value for key, value in pod_spec.get("securityContext", {}).items() if key in {"runAsUser", "runAsGroup"}
    }
    containers = [
        _container(c, pod_security, sidecar=c.get("restartPolicy") == "Always", init=c.get("restartPolicy") != "Always")
        for c in pod_spec.get("initContainers", [])
    ]
    containers += [_container(c, pod_security, sidecar=False) for c in pod_spec.get("containers", [])]
    volumes = tuple(_volume(v) for v in pod_spec.get("volumes", []))
    grace = float(pod_spec.get("terminationGracePeriodSeconds", 30))
    restart_policy = str(pod_spec.get("restartPolicy", "Always"))
    return PodPlan(name, tuple(containers), volumes, grace_period_s=grace, restart_policy=restart_policy)


def deployment_pod(objects: Iterable[Mapping[str, Any]], component: str = ENGINE_COMPONENT) -> PodPlan:
    """The pod template of the rendered Deployment of `component`: the serving pod by default."""
    deployments = [
        o
        for o in objects
        if o.get("kind") == "Deployment" and o["metadata"].get("labels", {}).get(COMPONENT_LABEL) == component
    ]
    if len(deployments) != 1:
        raise Glm53Error(
            f"expected exactly one Deployment of component {component!r} in the rendered chart, found "
            f"{len(deployments)}; check the values",
            EXIT_FAILURE,
        )
    deployment = deployments[0]
    return pod_from_spec(str(deployment["metadata"]["name"]), deployment["spec"]["template"]["spec"])


def helm_test_pods(objects: Iterable[Mapping[str, Any]]) -> tuple[PodPlan, ...]:
    """The rendered `helm test` pods (annotation helm.sh/hook: test), in render order."""
    return tuple(
        pod_from_spec(str(o["metadata"]["name"]), o["spec"])
        for o in objects
        if o.get("kind") == "Pod" and o["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    )
