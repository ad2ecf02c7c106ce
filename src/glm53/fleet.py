"""The CPU fleet: N CPU-mock pods behind the vLLM project's router (vllm-router) on loopback.

What the chart's `router.enabled=true` deploys, run on this machine: every replica is a whole `glm53 pod` (its own
LMCache server, engine stand-in and exporter, started and stopped by `glm53.pod.running_pod`), and the real
`vllm-router` binary sits in front of them with static `--worker-urls` (loopback has no Kubernetes API to discover pods
from). Each replica must pass its readiness check (/health, /v1/models; the startup probe is `glm53 pod`'s subject)
before the router starts, and the router must report every replica healthy before the fleet is handed out. Leaving
the fleet stops the router first, then the replicas, whatever happened, with SIGINT/SIGTERM ignored while stopping (as
`running_pod` does), so Ctrl-C leaves no process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.pod import (
    LOCALHOST,
    PodPorts,
    PodSpec,
    RunningPod,
    Supervised,
    Timing,
    free_ports,
    poll_until,
    running_pod,
    wait_ready,
)
from glm53.profiles import ModelProfile
from glm53.validate.progress import Progress
from glm53.validate.report import ValidationReport
from glm53.validate.runner import ValidationConfig, run_validation

# vllm_router/router_args.py:160-173 (`--policy` choices) that work with static loopback workers. kv_aware also needs
# every engine to publish KV events (`FleetSpec.kv_events`).
POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "consistent_hash", "kv_aware")
DEFAULT_POLICY = "cache_aware"
# Prefix-affine policies send a prompt's cold and cached runs to the same pod; validation needs that, because every
# pod has its own LMCache server and the cached run must find what the cold run stored.
PREFIX_AFFINE = ("cache_aware", "consistent_hash", "kv_aware")
# Validation through the router: the seed's equivalence and boundary checks (perf is a single-pod study).
FLEET_CHECKS = ("equivalence", "boundary")
KV_EVENTS_TOPIC = "kv-events"
# cache_aware and kv_aware route on tokens the router gets from a worker's POST /v1/completions/render (measured with
# 0.1.17: without it the router logs "Prefix input preparation unavailable ... render_unavailable" and routes on load
# alone). vLLM 0.33 serves that route only with this flag (vllm/entrypoints/scale_out/factories.py:94-129), so every
# replica gets it; the chart's engines need it too when the router is on.
SCALE_OUT_FLAG = "--enable-scale-out"


def scheduler_block_size(profile: ModelProfile) -> int:
    """The engine's block size, which is also the granularity of its KV events (1152 for GLM-5.3-Flash at TP 4)."""
    if profile.follows_unified_block_size:
        unified = profile.unified_block_size(profile.tensor_parallel_size)
        if unified is None:
            raise Glm53Error(f"{profile.display_name}'s block size at TP {profile.tensor_parallel_size} is unknown")
        return unified
    return max(profile.fixed_block_sizes)


def kv_events_config(port: int) -> str:
    """vLLM 0.33's `--kv-events-config` for a ZMQ publisher on `port` (fields: vllm/config/kv_events.py:14-47).

    The endpoint is the wildcard `tcp://*:P`, so it listens on every interface: vllm/distributed/kv_events.py:461-467
    binds only wildcard, `::` and ipc/inproc endpoints and *connects* to any other (`tcp://127.0.0.1:P` would leave
    publisher and router both connecting), zmq refuses `tcp://[::1]:P` without its IPv6 option, and vllm-router 0.1.17
    accepts only `tcp://HOST:PORT` sources (measured: "KV endpoint must be tcp://HOST:PORT without credentials or
    paths"). The chart does the same inside the pod, behind its NetworkPolicy.
    """
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    return json.dumps({**config, "topic": KV_EVENTS_TOPIC})


@dataclasses.dataclass(frozen=True)
class ReplicaSpec(PodSpec):
    """One fleet replica: a `glm53 pod` whose engine stand-in may get extra flags (e.g. a smaller local cache)."""

    extra_vllm_args: tuple[str, ...] = ()
    kv_events_port: int | None = None
    # The LMCache server's L1 in GiB; None: the pod's default.
    lmcache_l1_gb: float | None = None

    def lmcache_command(self) -> tuple[list[str], dict[str, str]]:
        argv, env = super().lmcache_command()
        # lmcache's argparse lets the last occurrence of a flag win (upstream.md, "Argument parsing").
        return (argv if self.lmcache_l1_gb is None else [*argv, "--l1-size-gb", f"{self.lmcache_l1_gb:g}"]), env

    def vllm_command(self) -> list[str]:
        # vLLM's parser (and the stand-in's argparse) let the last occurrence of a flag win.
        events = () if self.kv_events_port is None else ("--kv-events-config", kv_events_config(self.kv_events_port))
        return [*super().vllm_command(), SCALE_OUT_FLAG, *self.extra_vllm_args, *events]


@dataclasses.dataclass(frozen=True)
class RouterHealth:
    """How fast the router notices a dead replica: GET /health every `interval` s, out after `failures` misses."""

    interval_seconds: int = 1
    timeout_seconds: int = 2
    failures: int = 2


@dataclasses.dataclass(frozen=True)
class FleetSpec:
    profile: ModelProfile
    replicas: int
    policy: str
    workdir: Path
    # Per-replica local prefix-cache capacity in blocks (the stand-in's --num-gpu-blocks-override); None: its default.
    local_cache_blocks: int | None = None
    # Per-replica LMCache L1 in GiB; None: the pod's default.
    lmcache_l1_gb: float | None = None
    # Engines publish KV events (needed by kv_aware; harmless otherwise).
    kv_events: bool = False
    health: RouterHealth = dataclasses.field(default_factory=RouterHealth)
    timing: Timing = dataclasses.field(default_factory=Timing)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise Glm53Error(f"--replicas must be at least 1, got {self.replicas}")
        check_policy(self.policy, self.kv_events)

    def replica(self, index: int) -> ReplicaSpec:
        blocks = () if self.local_cache_blocks is None else ("--num-gpu-blocks-override", str(self.local_cache_blocks))
        workdir = self.workdir / f"replica-{index}"
        events = free_ports(1)[0] if self.kv_events else None
        return ReplicaSpec(
            self.profile,
            workdir,
            PodPorts.free(),
            timing=self.timing,
            extra_vllm_args=blocks,
            kv_events_port=events,
            lmcache_l1_gb=self.lmcache_l1_gb,
        )


def check_policy(policy: str, kv_events: bool) -> None:
    if policy not in POLICIES:
        raise Glm53Error(f"the router policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "kv_aware" and not kv_events:
        raise Glm53Error("the kv_aware policy needs engines that publish KV events; start the fleet with kv_events on")


def router_command(
    program: str, policy: str, port: int, metrics_port: int, pods: Sequence[RunningPod], health: RouterHealth
) -> list[str]:
    """The `vllm-router` command line for static workers on loopback (flags: vllm_router/router_args.py)."""
    urls = [pod.spec.vllm_url for pod in pods]
    command = [
        program,
        *("--host", LOCALHOST, "--port", str(port), "--worker-urls", *urls, "--policy", policy),
        # router_args.py:99: /health is also the default; vLLM answers 503 there once its engine died.
        *("--health-check-endpoint", "/health", "--health-check-interval-secs", str(health.interval_seconds)),
        *("--health-check-timeout-secs", str(health.timeout_seconds)),
        *("--health-failure-threshold", str(health.failures), "--health-success-threshold", "1"),
        # A request that meets a replica which just died is retried (router_args.py:88-93); spreading the retries over
        # 0.5+1+2+4+8 s outlasts the health check above, so a retry is routed to a live replica, not the dead one.
        *("--retry-max-retries", "5", "--retry-initial-backoff-ms", "500", "--retry-backoff-multiplier", "2"),
        *("--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1"),
        *("--prometheus-host", LOCALHOST, "--prometheus-port", str(metrics_port)),
    ]
    if policy == "kv_aware":
        # router_args.py:240-265: static sources, one per worker URL; block size and model shared by all workers.
        profile = pods[0].spec.profile
        for pod in pods:
            assert isinstance(pod.spec, ReplicaSpec) and pod.spec.kv_events_port is not None
            command += ["--kv-event-source", f"{pod.spec.vllm_url}=tcp://{LOCALHOST}:{pod.spec.kv_events_port}"]
        command += ["--kv-event-block-size", str(scheduler_block_size(profile)), "--kv-event-model", profile.model_id]
    return command


def router_program() -> str:
    """The vllm-router console script of this interpreter's environment (the `fleet` extra), else the one on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if not found:
        raise Glm53Error("vllm-router is not installed; install the toolkit's `fleet` extra (pip install '.[fleet]')")
    return found


def healthy_workers(workers_json: str) -> list[str]:
    """URLs the router's GET /workers lists as healthy (vllm-router 0.1.17: {"workers": [{"url", "is_healthy"}]})."""
    workers = json.loads(workers_json).get("workers", [])
    return [str(w["url"]) for w in workers if w.get("is_healthy")]


@dataclasses.dataclass
class RunningFleet:
    spec: FleetSpec
    policy: str
    pods: list[RunningPod]
    router: Supervised
    url: str

    def healthy(self) -> list[str]:
        with urllib.request.urlopen(f"{self.url}/workers", timeout=5.0) as response:
            return healthy_workers(response.read().decode())

    def check_router(self) -> None:
        self.router.check_running(EXIT_FAILURE)


def _stop_ignoring_interrupts(process: Supervised, grace_seconds: float) -> None:
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        process.stop(grace_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def running_replicas(spec: FleetSpec, say: Callable[[str], None]) -> Iterator[list[RunningPod]]:
    """Start every replica (each a whole pod) and wait until each is ready; on leaving, stop them all."""
    spec.workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        pods: list[RunningPod] = []
        for index in range(spec.replicas):
            replica_say = functools.partial(_prefixed, say, f"replica {index}: ")
            pods.append(stack.enter_context(running_pod(spec.replica(index), replica_say)))
        for index, pod in enumerate(pods):
            wait_ready(pod)
            say(f"fleet: replica {index} ready at {pod.spec.vllm_url}")
        yield pods


def _prefixed(say: Callable[[str], None], prefix: str, line: str) -> None:
    say(prefix + line)


@contextlib.contextmanager
def running_router(
    spec: FleetSpec, pods: list[RunningPod], policy: str, say: Callable[[str], None]
) -> Iterator[RunningFleet]:
    """Start vllm-router over the replicas and wait until it reports every live one healthy; stop it on leaving."""
    check_policy(policy, spec.kv_events)
    port, metrics_port = free_ports(2)
    command = router_command(router_program(), policy, port, metrics_port, pods, spec.health)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    router = Supervised("router", spec.workdir / f"router-{policy}.log", command, env)
    try:
        fleet = RunningFleet(spec, policy, pods, router, f"http://{LOCALHOST}:{port}")
        live = sorted(pod.spec.vllm_url for pod in pods if all(p.process.poll() is None for p in pod.processes))
        # poll_until fails early when any process it watches exits, and names the fleet's work dir.
        watched = RunningPod(dataclasses.replace(pods[0].spec, workdir=spec.workdir), [router])
        poll_until(lambda: _healthy_are(fleet, live), spec.timing.http_deadline, watched, "the router's /workers")
        say(f"fleet: vllm-router ({policy}) at {fleet.url} over {len(live)} replicas")
        yield fleet
    finally:
        _stop_ignoring_interrupts(router, spec.timing.grace_seconds)


@contextlib.contextmanager
def running_fleet(spec: FleetSpec, say: Callable[[str], None]) -> Iterator[RunningFleet]:
    """The replicas, then the router with the fleet's policy; leaving stops the router first, then the replicas."""
    with running_replicas(spec, say) as pods, running_router(spec, pods, spec.policy, say) as fleet:
        yield fleet


def _healthy_are(fleet: RunningFleet, urls: list[str]) -> bool:
    try:
        return sorted(fleet.healthy()) == urls
    except (OSError, ValueError):
        return False


def validate_fleet(fleet: RunningFleet, progress: Progress) -> ValidationReport:
    """`glm53 validate` through the router: equivalence and boundary, as a client of the fleet would see them."""
    profile = fleet.spec.profile
    config = ValidationConfig(fleet.url, profile, checks=FLEET_CHECKS, chunk_size=profile.recommended_chunk_size)
    try:
        return run_validation(config, progress)
    except Glm53Error as error:
        fleet.check_router()
        raise Glm53Error(f"validation through the router could not complete: {error.message}", EXIT_FAILURE) from None
