"""The CPU pod on this machine: the README's main job, running exactly what the chart renders in mock mode.

The chart (`charts/glm53`, `mock.enabled=true`) is the pod's one definition. `pod_values` says which install this is
(profile, fault, the exporter and the validation test pod on, and probe periods of a second so the job stays fast);
`glm53.pod.chart` renders it, `glm53.pod.plan` reads the Deployment's pod and the `helm test` pod into plans, and
`glm53.pod.loopback` runs the serving pod on 127.0.0.1 with its ports moved to free ones (printed). What the pod runs:
the real `lmcache server` (LMCache 0.5.6) as the native sidecar under `glm53 supervise`, which must pass its startup
probe before the engine stand-in (`glm53 mock vllm`, which moves KV data with LMCache's own client) and the exporter
start. Then the engine's startup probe (`glm53 probe startup`) runs at its rendered period until Ready, then its
readiness probe; then the test pod's `glm53 validate` command, parsed by that command's own parser and pointed at the
pod (the Service has no DNS here), runs in this process so its progress shows; then the exporter's `/metrics` and the
server's own `/metrics` (on its HTTP port) are read, as an operator would `curl` them; then everything stops.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from glm53.errors import EXIT_FAILURE, Glm53Error
from glm53.exporter.upstream import UpstreamError, fetch_text, parse_exposition, read_api_key
from glm53.pod import chart
from glm53.pod.contract import (
    DEFAULT_LMCACHE_GENERATION,
    ENGINE_CONTAINER,
    EXPORTER_CONTAINER,
    LMCACHE_API_KEY_SECRET,
    VALIDATE_CONTAINER,
)
from glm53.pod.loopback import LOCALHOST, RunningPod, quiet, running_pod, service_url_on_loopback, wait_probe
from glm53.pod.plan import ContainerPlan, PodPlan, deployment_pod, helm_test_pods
from glm53.pod.prometheus import ChartMonitoring, alert_report, watching
from glm53.probe.judge import EXIT_NOT_YET
from glm53.profiles import DEFAULT_PROFILE, PROFILES, ModelProfile, get_profile
from glm53.validate.options import build_parser, config_from_args
from glm53.validate.progress import Progress
from glm53.validate.report import ValidationReport
from glm53.validate.runner import ValidationConfig, run_validation

# The exporter series the main job shows: the geometry facts and whether the cache pays off.
EXPORTER_HIGHLIGHTS = (
    "glm53_geometry_matches_profile",
    "glm53_probe_status",
    "glm53_effective_chunk_size_tokens",
    "glm53_scheduler_block_size_tokens",
    "glm53_prefix_cache_hit_ratio",
    "glm53_prefix_cache_hit_tokens_total",
    "glm53_strict_prefix_bound_achieved_ratio",
    "glm53_sidecar_registered_engines",
    "glm53_sidecar_link_degraded",
)
# The real server's own counters the main job shows (lmcache_mp_* names, served on its HTTP port). The last two exist
# from 0.5.7rc2 on: the prompt as sent, and the request's hit counting vLLM's own prefix cache too (lmcache 0.5.7rc2
# v1/mp_observability/subscribers/metrics/lookup.py:185-190); a 0.5.6 server shows none of them.
LMCACHE_HIGHLIGHTS = (
    "lmcache_mp_lookup_requested_tokens_total",
    "lmcache_mp_lookup_hit_tokens_total",
    "lmcache_mp_lookup_prompt_tokens_total",
    "lmcache_mp_lookup_request_hit_tokens_total",
    "lmcache_mp_num_finished_stores_total",
    "lmcache_mp_num_finished_retrieves_total",
)
# How long vLLM's readiness and the metrics endpoints may take once their process is up (the kubelet never stops
# probing readiness; a runner on a terminal must).
HTTP_DEADLINE_S = 20.0


# The profile the real engine serves by default.
DEFAULT_REAL_PROFILE = "tiny-dense"
TINY_PROFILES = tuple(name for name, p in PROFILES.items() if p.tiny_model is not None)


def engine_and_profile(engine: str | None, profile_name: str | None, fault: str | None) -> tuple[str, ModelProfile]:
    """The engine and profile a run uses: each defaults from the other, and a combination that cannot run is refused.

    The real engine serves only the profiles with a tiny CPU test model; an injected fault lives in the stand-in.
    """
    if engine is None:
        has_tiny = profile_name is None or get_profile(profile_name).tiny_model is not None
        engine = "vllm" if has_tiny and not fault else "standin"
    profile = get_profile(profile_name or (DEFAULT_REAL_PROFILE if engine == "vllm" else DEFAULT_PROFILE))
    if engine == "vllm" and profile.tiny_model is None:
        raise Glm53Error(
            f"--engine vllm runs the real engine on a tiny CPU test model, which profile {profile.name} has none of "
            f"(its weights and geometry need H200s); use --engine standin, or a profile with one: "
            f"{', '.join(TINY_PROFILES)}"
        )
    if engine == "vllm" and fault:
        raise Glm53Error(f"--fault {fault} is injected by the engine stand-in; add --engine standin")
    return engine, profile


@dataclass(frozen=True)
class PodOptions:
    """Which install of the chart this is: the profile, an injected fault, and whether validation is possible."""

    profile: ModelProfile
    # Which engine the chart's mock mode runs (mock.engine): `vllm`, the real engine on the profile's tiny model, or
    # `standin`, `glm53 mock vllm` emulating the profile.
    engine: str = "standin"
    fault: str | None = None
    # The chart's validation.enabled: vLLM's dev mode (for /reset_prefix_cache) and the `helm test` pod. Off, vLLM
    # starts as production would.
    validation: bool = True
    # Further `glm53 validate` arguments of the test pod (e.g. `--runs 8`), after the runner's own.
    validate_args: tuple[str, ...] = ()
    chart: Path | None = None
    # The chart's lmcache.generation: which LMCache the server and the connector import (a non-default one from its
    # overlay in this venv, scripts/setup.d/26-lmcache-negotiating.sh).
    lmcache_generation: str = DEFAULT_LMCACHE_GENERATION
    # Further chart values layered on top (the fleet's router and cache sizes), as `--set` would.
    values: Mapping[str, Any] = field(default_factory=dict)
    # The Secrets the operator created that the pod reads as variables, (name, key) -> value: the shared L2 tier's
    # Redis password, which the caller's Redis was started with. A missing one gets a fresh random value.
    secrets: Mapping[tuple[str, str], str] = field(default_factory=dict)


# Startup-probe attempts, a second apart: the stand-in loads in 2 s; the real CPU engine's start-up (three processes
# importing vLLM, no torch.compile at -O0) took 77 s alone on 2 cores, and more than 300 s in CI beside the LMCache
# source build when it still compiled, so it gets 15 minutes (the startup probe only bounds a hung start; a healthy one
# is Ready as soon as its lines are logged).
STARTUP_ATTEMPTS = {"standin": 30, "vllm": 900}
# Seconds per validation request: a cold 8507-token prefill of the tiny hybrid on 2 CPU cores took 24 s here.
VALIDATE_TIMEOUT = {"standin": 60, "vllm": 300}
# Paired continuations in the main job: two per template (the seed's 72 take the real CPU engine about 10 minutes;
# `helm test` and `glm53 validate` run all 72).
MAIN_JOB_PAIRS = 6


def pod_values(options: PodOptions) -> dict[str, Any]:
    """The chart values of the CPU pod: mock mode with the exporter, probes every second, a 15 s stop grace period.

    The stand-in "loads weights" for 2 s so the startup probe is seen saying "not yet"; the rendered probes are what
    the runner runs, so their periods here are what keeps the main job fast.
    """
    values = {
        "profile": options.profile.name,
        "mock": {
            "enabled": True,
            "engine": options.engine,
            "loadSeconds": 2,
            "vllmExtraArgs": ["--fault", options.fault] if options.fault else [],
        },
        "weights": {"source": "none"},
        "exporter": {"enabled": True},
        "validation": {
            "enabled": options.validation,
            "extraArgs": [
                *("--timeout", str(VALIDATE_TIMEOUT[options.engine])),
                *("--pairs", str(MAIN_JOB_PAIRS)),
                *options.validate_args,
            ],
        },
        "probes": {
            "startup": {"periodSeconds": 1, "failureThreshold": STARTUP_ATTEMPTS[options.engine]},
            "readiness": {"periodSeconds": 1},
            "lmcache": {"periodSeconds": 1},
        },
        "terminationGracePeriodSeconds": 15,
    }
    if options.lmcache_generation != DEFAULT_LMCACHE_GENERATION:
        values["lmcache"] = {
            "generation": options.lmcache_generation,
            "apiKey": {"secretName": LMCACHE_API_KEY_SECRET},
        }
    return chart.merged(values, options.values)


def lmcache_overlay(generation: str) -> Path:
    """Where this venv holds a non-default generation (scripts/setup.d/26-lmcache-negotiating.sh installs it there):
    the chart's PYTHONPATH /opt/glm53/lmcache-<generation> as the loopback runner maps the images' venv."""
    return Path(sys.prefix) / f"lmcache-{generation}"


def require_lmcache_overlay(generation: str) -> None:
    """A non-default generation runs from its overlay in this venv; without it the pod would silently run 0.5.6's
    server under the other generation's flags."""
    overlay = lmcache_overlay(generation)
    if generation != DEFAULT_LMCACHE_GENERATION and not overlay.is_dir():
        raise Glm53Error(
            f"--lmcache-generation {generation} runs lmcache {generation} from {overlay}, which is missing; run "
            "bash scripts/setup.d/26-lmcache-negotiating.sh"
        )


@dataclass(frozen=True)
class PodPlans:
    """The rendered serving pod and, with validation on, the `helm test` pod."""

    serving: PodPlan
    test: PodPlan | None
    # PodOptions.secrets: what the runners give the pod's Secret variables.
    secrets: Mapping[tuple[str, str], str] = field(default_factory=dict)


def render_plans(options: PodOptions) -> PodPlans:
    objects = chart.render(pod_values(options), options.chart)
    tests = helm_test_pods(objects)
    return PodPlans(deployment_pod(objects), tests[0] if tests else None, options.secrets)


@dataclass(frozen=True)
class PodAddresses:
    """Where a running pod answers on loopback."""

    vllm: str
    lmcache: str  # the (first) server's HTTP front: /healthcheck and /metrics
    exporter: str | None
    # Every LMCache server's HTTP front, in rank order: one, or one per TP rank (lmcache.serverLayout=perRank).
    lmcache_servers: tuple[str, ...] = ()

    @classmethod
    def of(cls, plan: PodPlan) -> PodAddresses:
        """Read from a relocated plan: the engine's `http` port, each sidecar's `--http-port`, the exporter's port."""
        names = {c.name for c in plan.containers}
        exporter = (
            f"http://{LOCALHOST}:{plan.container(EXPORTER_CONTAINER).port('metrics')}/metrics"
            if EXPORTER_CONTAINER in names
            else None
        )
        servers = tuple(f"http://{LOCALHOST}:{c.option('--http-port')}" for c in plan.lmcache_servers())
        return cls(
            vllm=f"http://{LOCALHOST}:{plan.container(ENGINE_CONTAINER).port('http')}",
            lmcache=servers[0],
            exporter=exporter,
            lmcache_servers=servers,
        )


def wait_pod_ready(pod: RunningPod, say: Callable[[str], None]) -> None:
    """After the sidecar passed its startup probe: the engine's startup probe until Ready, then its readiness probe."""
    for sidecar in pod.plan.lmcache_servers():
        url = f"http://{LOCALHOST}:{sidecar.option('--http-port')}"
        chunk = sidecar.option("--chunk-size") if "--chunk-size" in sidecar.argv else "negotiated"
        say(
            f"pod: LMCache {lmcache_release(sidecar)} server {sidecar.name} healthy after "
            f"{pod.startup_seconds[sidecar.name]:.1f} s at {url}/healthcheck (ZMQ on port {sidecar.option('--port')}, "
            f"chunk size {chunk}, L1 {sidecar.option('--l1-size-gb')} GB)"
        )
    engine = pod.plan.container(ENGINE_CONTAINER)
    if engine.startup_probe is None or engine.readiness_probe is None:
        raise Glm53Error("the chart's engine container has no exec startup or readiness probe", EXIT_FAILURE)
    # "Not yet" (3) spends the budget; any other answer (4: wrong geometry or chunk size) cannot heal by waiting.
    ready = wait_probe(
        pod, ENGINE_CONTAINER, engine.startup_probe, say, "startup probe", lambda code: code != EXIT_NOT_YET
    )
    say(f"pod: startup probe Ready: {ready}")
    wait_probe(pod, ENGINE_CONTAINER, engine.readiness_probe, quiet, "readiness probe", within_s=HTTP_DEADLINE_S)


def lmcache_release(container: ContainerPlan) -> str:
    """The LMCache a rendered container imports: its PYTHONPATH's overlay (`.../lmcache-<generation>`), else the
    environment's own release."""
    overlay = dict(container.env).get("PYTHONPATH", "")
    name = Path(overlay.split(os.pathsep)[0]).name if overlay else ""
    return name.removeprefix("lmcache-") if name.startswith("lmcache-") else DEFAULT_LMCACHE_GENERATION


@contextlib.contextmanager
def started_pod(plans: PodPlans, workdir: Path, say: Callable[[str], None]) -> Iterator[RunningPod]:
    """The serving pod running, its startup probe Ready and its readiness probe passing; stopped on leaving."""
    with running_pod(plans.serving, workdir, say, secret_values=plans.secrets) as pod:
        wait_pod_ready(pod, say)
        yield pod


def validation_config(test_pod: PodPlan, engine_port: int, exporter_port: int | None) -> ValidationConfig:
    """The `helm test` pod's `glm53 validate` command, parsed by its own parser, aimed at the pod, not the Service:
    the engine's port, and the exporter's for LMCache's commits (None: validate without waiting for them)."""
    argv = test_pod.container(VALIDATE_CONTAINER).argv
    try:
        args = build_parser().parse_args(argv[2:])  # after `glm53 validate`
    except SystemExit:
        raise Glm53Error(f"the chart's test pod command does not parse: {list(argv)}", EXIT_FAILURE) from None
    config = config_from_args(args)
    metrics = config.lmcache_metrics
    return replace(
        config,
        base_url=service_url_on_loopback(config.base_url, engine_port),
        lmcache_metrics=service_url_on_loopback(metrics, exporter_port) if metrics and exporter_port else None,
    )


def say_to(stream: TextIO) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(message, file=stream, flush=True)

    return say


def named_samples(exposition: str, names: tuple[str, ...]) -> list[Sample]:
    """The samples whose name starts with one of `names`, in exposition order (`_created` timestamps dropped)."""
    try:
        families = parse_exposition(exposition).families
    except UpstreamError as error:
        raise Glm53Error(f"a metrics page of the pod is {error.detail}", EXIT_FAILURE) from None
    return [s for f in families for s in f.samples if s.name.startswith(names) and not s.name.endswith("_created")]


def exposition_line(sample: Sample) -> str:
    """`sample` as prometheus_client's text exposition writes it: labels sorted and escaped, the value Go-style."""
    escape = str.maketrans({"\\": r"\\", "\n": r"\n", '"': r"\""})
    labels = ",".join(f'{k}="{v.translate(escape)}"' for k, v in sorted(sample.labels.items()))
    braced = f"{{{labels}}}" if labels else ""
    value = floatToGoString(sample.value)  # type: ignore[no-untyped-call]  # the writer's own float format
    return f"{sample.name}{braced} {value}"


def highlights(exposition: str, names: tuple[str, ...]) -> list[str]:
    """The named series' samples as exposition lines, in exposition order (comments and `_created` dropped)."""
    return [exposition_line(sample) for sample in named_samples(exposition, names)]


def exporter_highlights(exposition: str) -> list[str]:
    return highlights(exposition, EXPORTER_HIGHLIGHTS)


def totals(exposition: str, names: tuple[str, ...]) -> list[str]:
    """One line per named series: its samples summed over every label set (the server labels each cache_salt)."""
    sums: dict[str, tuple[float, int]] = {}
    for sample in named_samples(exposition, names):
        if sample.name in names:
            total, count = sums.get(sample.name, (0.0, 0))
            sums[sample.name] = (total + sample.value, count + 1)
    return [f"{name} {sums[name][0]:g} (sum of {sums[name][1]} series)" for name in names if name in sums]


def server_api_key(sidecar: ContainerPlan) -> str | None:
    """The key a keyed LMCache server (`--api-key-file`, the negotiating generation) wants on /metrics, read from the
    file it reads; None for a server without one."""
    return read_api_key(Path(sidecar.option("--api-key-file"))) if "--api-key-file" in sidecar.argv else None


def scrape(pod: RunningPod, url: str, api_key: str | None = None) -> str:
    """What `curl` on a metrics endpoint shows an operator (with the server's key as a bearer token when it has one);
    it may take a moment to answer after start-up."""
    deadline = time.monotonic() + HTTP_DEADLINE_S
    while True:
        pod.check_running(EXIT_FAILURE)
        try:
            return fetch_text(url, timeout=10.0, api_key=api_key)
        except UpstreamError as error:
            if time.monotonic() > deadline:
                raise Glm53Error(f"{url} did not answer ({error}); see the logs in {pod.workdir}") from None
        time.sleep(0.1)


@dataclass(frozen=True)
class PodOutcome:
    report: ValidationReport
    addresses: PodAddresses
    exporter_lines: list[str]
    lmcache_lines: list[str]  # the real servers' lmcache_mp_* counters after validation, summed over cache salts
    lmcache_startup_seconds: float  # spawn of the first sidecar to the last one's startup probe passing
    seconds: float  # start to all processes stopped
    # What a real Prometheus with the chart's rules said of the pod after validation (`alert_report`); empty when none
    # watched it.
    alert_lines: list[str] = field(default_factory=list)


def run_pod(
    plans: PodPlans,
    workdir: Path,
    say: Callable[[str], None],
    progress: Progress,
    monitoring: ChartMonitoring | None = None,
) -> PodOutcome:
    """Start the rendered pod, wait for its startup and readiness probes, validate, stop; the report says pass/fail.

    With `monitoring`, a real Prometheus scrapes the Ready pod through validation as the chart's ServiceMonitor would,
    evaluating the chart's PrometheusRule, and the outcome carries the alerts active once it saw the pod as it ended.
    """
    start = time.perf_counter()
    if plans.test is None:
        raise Glm53Error("the rendered chart has no `helm test` pod to validate with; render with validation on")
    with started_pod(plans, workdir, say) as pod, watching(monitoring, pod.plan, workdir / "prometheus") as watcher:
        watched_from = time.monotonic()
        if watcher is not None:
            say(f"pod: Prometheus at {watcher.url} scrapes the pod as the chart's ServiceMonitor would")
        urls = PodAddresses.of(pod.plan)
        exporter = pod.plan.container(EXPORTER_CONTAINER).port("metrics") if urls.exporter else None
        config = validation_config(plans.test, pod.plan.container(ENGINE_CONTAINER).port("http"), exporter)
        say(f"pod: vLLM ready at {urls.vllm}; validating ({', '.join(config.checks)})")
        try:
            report = run_validation(config, progress)
        except Glm53Error as error:
            pod.check_running(EXIT_FAILURE)  # a dead server explains the failure better than the request that noticed
            raise Glm53Error(f"validation could not complete: {error.message}", EXIT_FAILURE) from None
        pod.check_running(EXIT_FAILURE)
        exporter_lines = exporter_highlights(scrape(pod, urls.exporter)) if urls.exporter else []
        # With one server per rank the counters are summed over the servers too (each server counts its own lookups).
        servers = zip(urls.lmcache_servers, pod.plan.lmcache_servers(), strict=True)
        pages = [scrape(pod, f"{url}/metrics", server_api_key(sidecar)) for url, sidecar in servers]
        lmcache_lines = totals("\n".join(pages), LMCACHE_HIGHLIGHTS)
        # The servers start one after another (each native sidecar waits for the one before).
        startup = sum(pod.startup_seconds[c.name] for c in pod.plan.lmcache_servers())
        alert_lines = []
        if watcher is not None and monitoring is not None:
            watcher.wait_settled()
            alert_lines = alert_report(watcher.alerts(), monitoring, time.monotonic() - watched_from)
    return PodOutcome(report, urls, exporter_lines, lmcache_lines, startup, time.perf_counter() - start, alert_lines)
