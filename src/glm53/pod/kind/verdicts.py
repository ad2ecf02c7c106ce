"""Judge what the cluster reports during a smoke test: the serving pod's readiness, the geometry its containers
logged, and the failure report (describe, events, every container's log).

Why: all of it is read from plain data, pods and events as the JSON dictionaries the Kubernetes API returns and log
lines as `glm53.probe.logparse` parses them, so the tests drive every verdict with fake data, which is all CI can
honestly offer: it has no Docker registry and no Kubernetes. The one source of data is a `ClusterReader` handed in;
`glm53.pod.kind.run` hands in the real one (the Kubernetes client) and writes the files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Protocol

from glm53.pod.contract import ENGINE_CONTAINER, SIDECAR_CONTAINER
from glm53.probe.logparse import (
    AttentionBlockSize,
    ChunkSizeRejected,
    EngineDied,
    MalformedLine,
    NegotiatedChunk,
    Record,
    ResolvedGeometry,
    ServerUnreachable,
)
from glm53.profiles import ModelProfile

# A Kubernetes object as the API returns it: camelCase JSON turned into dictionaries and lists.
KubeObject = Mapping[str, Any]


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
