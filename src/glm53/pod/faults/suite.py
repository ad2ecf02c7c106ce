"""The fault suite: the chart's pod on loopback, under load, kept alive as the kubelet would, and the sidecar hurt.

Why: what the pod promises after Ready is decided by upstream code the stand-in once got wrong (it exited when the
sidecar died; vLLM degrades and serves on). So the suite runs the pod the chart renders (the real vLLM engine on a tiny
model by default, or the stand-in), with `glm53.pod.kubelet` restarting containers as the kubelet does, drives
`glm53.pod.faults.load` through it, and hurts the real `lmcache server` the way a node does:
- `kill`: SIGKILL (an OOM kill); the kubelet starts the sidecar again at once, as it does the first time: the race of
  LMCache #4642, where no ping fails and the engine never registers with the new server;
- `kill-slow`: SIGKILL, and the sidecar back only after 35 s (a crash loop's back-off, a slow node): the engine's pings
  fail, it enters degraded mode and registers again by itself;
- `term`: SIGTERM (an eviction, a rollout of the sidecar alone): the server exits at once without draining;
- `freeze`: SIGSTOP for 30 s, then SIGCONT (a stalled node, a debugger): the liveness probe may kill it first;
- `idle`: no request for 45 s after Ready, with the server's reaper shortened to 30 s (`--worker-reap-timeout-seconds`
  and `--worker-registration-grace-seconds`, whose defaults are 120 s and 3600 s): an engine that registered and never
  pinged is reaped, and later requests hang (LMCache #4715, #4795). It runs first, before any load;
- `absent`: the sidecar passes its startup probe and is SIGKILLed just before the engine starts; the kubelet brings it
  back once the engine's connector is asking for it (its worker adapter logged its creation), so the engine starts
  with no server and waits; with the chart's supervisor hold too, the server is back well within the connector's
  `lmcache.mp.mq_timeout`, shortened from 300 s to ABSENT_MQ_TIMEOUT_S;
- `absent-long`: the same, with the sidecar held ABSENT_LONG_PAST_S past that `mq_timeout`: the engine's start fails,
  and the kubelet restarts the engine (on GPUs a reload of the weights: the fallback, never the plan).
An `absent` fault is played while the pod starts, so it comes first and needs a pod of its own: with `idle` too
(which needs an engine that has served nothing) the other faults follow on a second pod. Each fault is watched for
`observe_s` after its injection, then the next one follows on the same pod. Three settings are compared: the chart's
(`lmcache.resilience`, and its default L2 tier), the chart's without the L2 tier (`chart-l1-only`), and upstream's
defaults (`kv_load_failure_policy=fail`, no restart hold, no warm-up, no L2 tier), so the table shows what each
setting buys. After each fault on a Ready pod, documents stored before it are sent again, and the table says how
much of them the cache still held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glm53.errors import EXIT_USAGE, Glm53Error
from glm53.pod.contract import ENGINE_CONTAINER, SIDECAR_CONTAINER
from glm53.pod.faults.load import Load, LoadShape, StoredDocument
from glm53.pod.faults.table import FaultRow, FaultWindow, hits_confirmed, row, with_revisits
from glm53.pod.kubelet import Kubelet, kubelet
from glm53.pod.loopback import RunningPod, relocate, relocation_for, running_pod
from glm53.pod.main_job import (
    HTTP_DEADLINE_S,
    PodAddresses,
    PodOptions,
    PodPlans,
    pod_values,
    render_plans,
    started_pod,
)
from glm53.pod.plan import PodPlan
from glm53.pod.prometheus import AlertsSeen, Prometheus, chart_monitoring, loopback_pod_name, watching
from glm53.profiles import ModelProfile

IDLE_S = 45.0
SHORT_REAP_S = 30.0  # lmcache 0.5.6 config.py:510-527: the reap timeout must be >= 3 x the 10 s heartbeat interval
FREEZE_S = 30.0
SLOW_RESTART_S = 35.0
# The shortened `lmcache.mp.mq_timeout` of an `absent` pod (lmcache 0.5.6 vllm_multi_process_adapter.py:120-123: 300 s):
# well above the chart's supervisor hold (25 s) plus the server's start (5-7 s idle, 52 s measured on a loaded 2-core
# machine; at 60 s the chart's sidecar was back 57.6 s after the connector asked), as 300 s is on a cluster.
ABSENT_MQ_TIMEOUT_S = 120.0
# `absent-long`: how far past the connector's `mq_timeout` the sidecar stays away, counted from the connector's ask.
ABSENT_LONG_PAST_S = 10.0
# lmcache 0.5.6 vllm_multi_process_adapter.py:1415-1417, in LMCacheMPWorkerAdapter.__init__ just before its first
# blocking call, GET_CHUNK_SIZE (:1459-1466), which waits up to mq_timeout for a server: the connector is asking.
CONNECTOR_ASKS = "LMCache MP worker adapter created with instance_id="
# How long an `absent` pod's engine may take to be Ready, restarts included (two CPU starts on a busy machine).
ABSENT_READY_S = 900.0
# Upstream's defaults where the chart differs (charts/glm53/values.yaml, lmcache.resilience), and LMCache's: no L2 tier.
UPSTREAM_RESILIENCE = {"kvLoadFailurePolicy": "fail", "restartHoldSeconds": 0, "warmUp": False}
# The settings a table is made for: the chart's; the chart's without its L2 tier (L1 only: what the tier buys);
# upstream's defaults.
SETTINGS = ("chart", "chart-l1-only", "upstream")
# vLLM's local KV cache on the fault pod (real engine): 96 blocks of 64 tokens, a few documents only, so reloads come
# from LMCache; vLLM refuses a cache smaller than one request of the model's length, hence the shorter context.
LOCAL_BLOCKS = 96
LOCAL_MAX_MODEL_LEN = 4096
# After each fault on a Ready pod, this many documents stored before it are sent again, each stored at least SETTLED_S
# before the fault (settled_before).
REVISITED = 4
SETTLED_S = 5.0
# How long a fault waits for those documents before it is injected anyway (a cold CPU prefill takes about 1 s).
SETTLED_WAIT_S = 60.0
# The fewest whole LMCache chunks a load's document holds (load_on).
WHOLE_CHUNKS = 2
# How often a watched fault asks Prometheus for its active alerts (the chart's rules are evaluated every second here).
ALERT_POLL_S = 1.0


@dataclass(frozen=True)
class Fault:
    """One fault; it is watched until LMCache's hits are back (and seen again) or for `observe_s` at most."""

    name: str
    summary: str
    observe_s: float


FAULTS = {
    f.name: f
    for f in (
        Fault("idle", f"no request for {IDLE_S:g} s after Ready (server reaper shortened to {SHORT_REAP_S:g} s)", 180),
        Fault("kill", "sidecar SIGKILLed, restarted by the kubelet (at once the first time, then after back-off)", 180),
        Fault("term", "sidecar SIGTERMed, restarted by the kubelet (at once the first time, then after back-off)", 180),
        Fault("freeze", f"sidecar SIGSTOPped for {FREEZE_S:g} s, then SIGCONTed", 180),
        Fault("kill-slow", f"sidecar SIGKILLed, back after {SLOW_RESTART_S:g} s", 180),
        Fault(
            "absent",
            "sidecar SIGKILLed just before the engine starts, restarted once the engine's connector asks for it "
            f"(mq_timeout {ABSENT_MQ_TIMEOUT_S:g} s)",
            180,
        ),
        Fault(
            "absent-long",
            "sidecar SIGKILLed just before the engine starts, restarted "
            f"{ABSENT_MQ_TIMEOUT_S + ABSENT_LONG_PAST_S:g} s after the engine's connector asks for it "
            f"(mq_timeout {ABSENT_MQ_TIMEOUT_S:g} s)",
            180,
        ),
    )
}
# Faults played while the pod starts; the rest are played on a Ready pod.
START_FAULTS = ("absent", "absent-long")


def parse_faults(names: Sequence[str]) -> list[Fault]:
    """The named faults in the suite's order: a pod-start fault first (it needs the pod's start), then `idle` (it
    needs a pod that has served nothing), then the rest."""
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        raise Glm53Error(f"unknown fault {unknown[0]!r}; choose from {', '.join(FAULTS)}", EXIT_USAGE)
    chosen = [fault for name, fault in FAULTS.items() if name in names]
    return sorted(chosen, key=lambda f: (f.name not in START_FAULTS, f.name != "idle"))


def pod_groups(faults: Sequence[Fault]) -> list[tuple[Fault, ...]]:
    """The faults of each pod the suite starts, in order: one pod per pod-start fault, whose start it is; the faults
    on a Ready pod follow on the last one, unless `idle` is among them (it needs an engine that served nothing)."""
    starts: list[tuple[Fault, ...]] = [(f,) for f in faults if f.name in START_FAULTS]
    rest = tuple(f for f in faults if f.name not in START_FAULTS)
    if rest and starts and rest[0].name != "idle":
        return [*starts[:-1], starts[-1] + rest]
    return [*starts, rest] if rest else starts


def with_mq_timeout(plan: PodPlan, seconds: float) -> PodPlan:
    """`plan` with the engine's connector waiting `seconds` for each blocking call to the sidecar (`lmcache.mp.
    mq_timeout` in the rendered `--kv-transfer-config`; the chart leaves upstream's 300 s)."""
    engine = plan.container(ENGINE_CONTAINER)
    argv = list(engine.argv)
    at = argv.index("--kv-transfer-config") + 1
    config = json.loads(argv[at])
    config["kv_connector_extra_config"]["lmcache.mp.mq_timeout"] = seconds
    argv[at] = json.dumps(config, separators=(",", ":"))
    containers = tuple(dataclasses.replace(c, argv=tuple(argv)) if c is engine else c for c in plan.containers)
    return dataclasses.replace(plan, containers=containers)


@dataclass(frozen=True)
class SuiteOptions:
    profile: ModelProfile
    engine: str
    settings: str
    faults: tuple[Fault, ...]
    shape: LoadShape = field(default_factory=LoadShape)
    # Seconds a request may take before it counts as hung (a cold CPU prefill of the document takes about 1 s).
    hang_s: float = 60.0
    warm_s: float = 15.0
    chart: Path | None = None
    # Watch each fault played on a Ready pod with a real Prometheus and the chart's alerts (the row's alerts column).
    prometheus: bool = False


def suite_values(options: SuiteOptions) -> dict[str, Any]:
    """The chart values of the fault pod beyond the main job's: the sidecar's probes at the chart's period, a small
    local KV cache (real engine), the shortened reaper for `idle`, and upstream's defaults when asked."""
    # The real engine's start on a busy 2-core machine took up to 4 minutes: 15 minutes of startup probes at 1 s.
    probes = {"lmcache": {"periodSeconds": 5}, "startup": {"failureThreshold": 900}}
    values: dict[str, Any] = {"probes": probes, "lmcache": {}}
    if options.engine == "vllm":
        local = ["--num-gpu-blocks-override", str(LOCAL_BLOCKS), "--max-model-len", str(LOCAL_MAX_MODEL_LEN)]
        values["mock"] = {"vllmExtraArgs": local}
    if any(f.name == "idle" for f in options.faults):
        reap = str(int(SHORT_REAP_S))
        values["lmcache"]["extraArgs"] = [
            *("--worker-reap-timeout-seconds", reap),
            *("--worker-registration-grace-seconds", reap),
        ]
    if options.settings == "upstream":
        values["lmcache"]["resilience"] = dict(UPSTREAM_RESILIENCE)
    if options.settings in ("upstream", "chart-l1-only"):
        values["lmcache"]["l2"] = {"type": "off"}
    return values


def _signal_sidecar(pod: RunningPod, signum: int) -> None:
    """Signal the sidecar container's whole process group (the supervisor and the server), as a node would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pod.process(SIDECAR_CONTAINER).process.pid, signum)


def _inject(fault: Fault, loop: Kubelet, load: Load, say: Callable[[str], None]) -> None:
    """Do the fault; returns once it is done (a freeze is resumed, an idle spell is over)."""
    if fault.name == "idle":
        time.sleep(IDLE_S)
        load.resume()
    elif fault.name in ("kill", "kill-slow"):
        if fault.name == "kill-slow":
            loop.hold_next_restart(SIDECAR_CONTAINER, SLOW_RESTART_S)
        _signal_sidecar(loop.pod, signal.SIGKILL)
    elif fault.name == "term":
        _signal_sidecar(loop.pod, signal.SIGTERM)
    elif fault.name == "freeze":
        _signal_sidecar(loop.pod, signal.SIGSTOP)
        time.sleep(FREEZE_S)
        _signal_sidecar(loop.pod, signal.SIGCONT)
    say(f"faults: {fault.name} done at t={load.now():.1f} s")


def run_suite(options: SuiteOptions, workdir: Path, say: Callable[[str], None]) -> list[FaultRow]:
    """Start the pod (one per group of `pod_groups`), then play each fault under load; one row per fault."""
    groups = pod_groups(options.faults)
    rows: list[FaultRow] = []
    for index, faults in enumerate(groups):
        where = workdir if index == len(groups) - 1 else workdir / faults[0].name
        rows += _run_pod(dataclasses.replace(options, faults=faults), where, say)
    return rows


def _load(options: SuiteOptions, plan: PodPlan) -> Load:
    """The load on a relocated plan (not started yet: its clock starts now)."""
    return load_on(plan, options.shape, options.profile.strict_prefix, options.hang_s)


def load_on(plan: PodPlan, shape: LoadShape, strict_prefix: bool, hang_s: float) -> Load:
    """A load on the pod of a relocated `plan`: its engine, its (first) LMCache server, its chunk size.

    Documents are at least WHOLE_CHUNKS chunks long: LMCache stores whole chunks only, so a document shorter than one
    (the default 1024 tokens against GLM-5.3-Flash's 1152-token chunk on the stand-in) gives it nothing to find, and
    every row would read "never" whatever the fault did."""
    urls = PodAddresses.of(plan)
    chunk = int(plan.container(SIDECAR_CONTAINER).option("--chunk-size"))
    shape = dataclasses.replace(shape, document_tokens=max(shape.document_tokens, WHOLE_CHUNKS * chunk))
    return Load(
        urls.vllm,
        urls.lmcache,
        _served_model(plan.container(ENGINE_CONTAINER).served_argv),
        shape,
        chunk,
        strict_prefix,
        hang_s,
    )


def _run_pod(options: SuiteOptions, workdir: Path, say: Callable[[str], None]) -> list[FaultRow]:
    values = suite_values(options)
    pod_options = PodOptions(options.profile, options.engine, validation=False, chart=options.chart, values=values)
    plans = render_plans(pod_options)
    monitoring = None
    if options.prometheus:
        monitoring = chart_monitoring(pod_values(pod_options), loopback_pod_name(plans.serving))
    first = options.faults[0]
    rows: list[FaultRow] = []
    if first.name in START_FAULTS:
        plans = dataclasses.replace(plans, serving=with_mq_timeout(plans.serving, ABSENT_MQ_TIMEOUT_S))
        with _absent_at_engine_start(first, options, plans, workdir, say) as (loop, load, injected, ready):
            # Watched from the engine's Ready: nothing can be sent before it (nor scraped: no alerts column).
            rows.append(_watch(first, injected, ready, loop, load, watch_from=ready))
            say(f"faults: {first.name}: {rows[-1]}")
            with watching(monitoring, loop.pod.plan, workdir / "prometheus") as watcher:
                rows += _play(options.faults[1:], loop, load, say, watcher)
            outcomes = load.stop()
    else:
        with started_pod(plans, workdir, say) as pod:
            load = _load(options, pod.plan)
            with kubelet(pod, say, clock=load.now) as loop, watching(monitoring, pod.plan, workdir / "prometheus") as w:
                idle_first = first.name == "idle"
                load.start(paused=idle_first)
                if not idle_first:
                    time.sleep(options.warm_s)
                rows += _play(options.faults, loop, load, say, w)
                outcomes = load.stop()
    (workdir / "outcomes.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return rows


def _play(
    faults: Sequence[Fault], loop: Kubelet, load: Load, say: Callable[[str], None], watcher: Prometheus | None = None
) -> list[FaultRow]:
    """Play `faults` one after the other on a Ready pod under running load; one row each, with the documents stored
    before each fault sent again once it is watched (does the cache still hold them?) and, with a `watcher`, the
    alerts it raised and whether they cleared once that was done."""
    rows = []
    for fault in faults:
        if fault.name != "idle":  # an idle spell begins before the first request
            _await_settled_documents(load)
        with _alerts_during(watcher) as seen:
            injected = load.now()
            say(f"faults: t={injected:.1f} s: {fault.name}: {fault.summary}")
            _inject(fault, loop, load, say)
            watched = _watch(fault, injected, load.now(), loop, load)
            current = with_revisits(watched, load.revisit(settled_before(load.stored_documents(), injected)))
            if watcher is not None:
                watcher.wait_settled()  # the rules evaluated on the pod as it is once the row is complete
        if watcher is not None and seen is not None:
            current = dataclasses.replace(current, alerts=seen.describe(watcher.alerts()))
        rows.append(current)
        say(f"faults: {fault.name}: {rows[-1]}")
    return rows


@contextlib.contextmanager
def _alerts_during(watcher: Prometheus | None) -> Iterator[AlertsSeen | None]:
    """The alerts `watcher` holds active, polled every ALERT_POLL_S in the background while the block runs: a freeze
    blocks the suite for its whole length, and an alert pending during it may have cleared when it is over."""
    if watcher is None:
        yield None
        return
    seen = AlertsSeen.starting(watcher.alerts())
    done = threading.Event()

    def poll() -> None:
        while not done.wait(ALERT_POLL_S):
            with contextlib.suppress(Glm53Error):  # one failed poll is a gap in the watch, not the fault's verdict
                seen.add(watcher.alerts())

    thread = threading.Thread(target=poll, name="alerts", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join()


def _await_settled_documents(load: Load) -> None:
    """Wait (SETTLED_WAIT_S at most) until REVISITED documents were stored SETTLED_S ago, so the fault has something
    stored before it to send again: a fault played right after the load began (or after the previous fault) would
    otherwise leave its column empty."""
    deadline = time.monotonic() + SETTLED_WAIT_S
    while len(settled_before(load.stored_documents(), load.now())) < REVISITED and time.monotonic() < deadline:
        time.sleep(0.5)


def settled_before(stored: Sequence[StoredDocument], injected_s: float) -> list[StoredDocument]:
    """The last REVISITED documents stored at least SETTLED_S before the fault: LMCache writes a chunk to its L2 tier
    after committing it to L1, so a document stored in the fault's last moments may never have reached the tier."""
    settled = [d for d in stored if d.stored_at_s <= injected_s - SETTLED_S]
    return settled[-REVISITED:]


@contextlib.contextmanager
def _absent_at_engine_start(
    fault: Fault, options: SuiteOptions, plans: PodPlans, workdir: Path, say: Callable[[str], None]
) -> Iterator[tuple[Kubelet, Load, float, float]]:
    """The pod started as the kubelet starts it, except that its sidecar is SIGKILLed once its startup probe passed
    and before the main containers start; the kubelet loop runs from then on (restarting the sidecar, held per the
    fault, and the engine if its start fails). Yields the loop, the load (started once the engine is Ready), and
    when the fault was injected and the engine became Ready (or gave up waiting), in the load's seconds."""
    plan = plans.serving
    relocation = relocation_for(plan, workdir, plans.secrets)
    # The loopback runner starts init containers and sidecars as a kubelet does; the main containers follow here.
    sidecars = dataclasses.replace(plan, containers=tuple(c for c in plan.containers if c.init or c.sidecar))
    with running_pod(sidecars, workdir, say, relocation) as pod:
        pod.plan = relocate(plan, relocation)
        load = _load(options, pod.plan)
        injected = 0.0  # the load's clock starts with it; the kubelet's events are in its tenths of a second
        say(f"faults: t={injected:.1f} s: {fault.name}: {fault.summary}")
        _signal_sidecar(pod, signal.SIGKILL)
        pod.process(SIDECAR_CONTAINER).process.wait()
        main = [c for c in pod.plan.containers if not c.init and not c.sidecar]
        for container in main:
            pod.start(container)
        loop = Kubelet(pod, say, clock=load.now, starting=[c.name for c in main])
        release = threading.Event()
        loop.hold_next_restart(SIDECAR_CONTAINER, until=release)
        past = ABSENT_MQ_TIMEOUT_S + ABSENT_LONG_PAST_S if fault.name == "absent-long" else 0.0
        log = workdir / "containers" / f"{ENGINE_CONTAINER}.log"
        watcher = threading.Thread(
            target=_release_when_asked, args=(log, past, release, load, say), name="absent", daemon=True
        )
        loop.start()
        watcher.start()
        try:
            if not loop.wait_started(ENGINE_CONTAINER, ABSENT_READY_S) or not _readiness_passes(pod):
                say(f"faults: {fault.name}: the engine was not Ready within {ABSENT_READY_S:g} s")
            ready = load.now()
            say(f"faults: {fault.name}: engine Ready at t={ready:.1f} s")
            load.start()
            yield loop, load, injected, ready
        finally:
            release.set()
            loop.stop()


def _readiness_passes(pod: RunningPod) -> bool:
    """Run the engine's readiness probe until it passes, as `glm53.pod.main_job.wait_pod_ready` does after the startup
    probe: without the warm-up (upstream's settings) the startup probe passes on the connector's log lines, a few
    seconds before vLLM's HTTP server listens."""
    probe = pod.plan.container(ENGINE_CONTAINER).readiness_probe
    deadline = time.monotonic() + HTTP_DEADLINE_S
    while probe is not None:
        if pod.process(ENGINE_CONTAINER).probe(probe)[0] == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(probe.period_s)
    return True


def _release_when_asked(
    log: Path, past_s: float, release: threading.Event, load: Load, say: Callable[[str], None]
) -> None:
    """Set `release` `past_s` after the engine's connector first asked for its server (CONNECTOR_ASKS in `log`)."""
    while not release.is_set():
        with contextlib.suppress(OSError):
            if CONNECTOR_ASKS in log.read_text(errors="replace"):
                break
        time.sleep(0.5)
    say(f"faults: t={load.now():.1f} s: the engine's connector asks for its server; the sidecar back in {past_s:g} s")
    release.wait(past_s)
    release.set()


def _watch(
    fault: Fault, injected: float, over: float, loop: Kubelet, load: Load, watch_from: float | None = None
) -> FaultRow:
    """The fault's row once hits are back and confirmed by further reloads, or `observe_s` after `watch_from` (by
    default the injection)."""
    deadline = (injected if watch_from is None else watch_from) + fault.observe_s
    while True:
        now = load.now()
        events = tuple(e for e in loop.restarts if injected <= e.at_s < now)
        again = tuple(e for e in loop.started_again if injected <= e.at_s < now)
        outcomes = load.snapshot()
        window = FaultWindow(fault.name, injected, now, events, over, again)
        current = row(window, outcomes)
        if hits_confirmed(current, window, outcomes) or now >= deadline:
            return current
        time.sleep(2.0)


def _served_model(argv: Sequence[str]) -> str:
    """The engine's served model: `--served-model-name` if given, else the stand-in's model argument (vLLM's rule)."""
    return next((argv[i + 1] for i, part in enumerate(argv[:-1]) if part == "--served-model-name"), argv[3])
