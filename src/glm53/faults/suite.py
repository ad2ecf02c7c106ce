"""The fault suite: the chart's pod on loopback, under load, kept alive as the kubelet would, and the sidecar hurt.

Why: what the pod promises after Ready is decided by upstream code the stand-in once got wrong (it exited when the
sidecar died; vLLM degrades and serves on). So the suite runs the pod the chart renders (the real vLLM engine on a tiny
model by default, or the stand-in), with `glm53.lifecycle` restarting containers as the kubelet does, drives
`glm53.faults.load` through it, and hurts the real `lmcache server` the way a node does:
- `kill`: SIGKILL (an OOM kill); the kubelet starts the sidecar again at once, as it does the first time: the race of
  LMCache #4642, where no ping fails and the engine never registers with the new server;
- `kill-slow`: SIGKILL, and the sidecar back only after 35 s (a crash loop's back-off, a slow node): the engine's pings
  fail, it enters degraded mode and registers again by itself;
- `term`: SIGTERM (an eviction, a rollout of the sidecar alone): the server exits at once without draining;
- `freeze`: SIGSTOP for 30 s, then SIGCONT (a stalled node, a debugger): the liveness probe may kill it first;
- `idle`: no request for 45 s after Ready, with the server's reaper shortened to 30 s (`--worker-reap-timeout-seconds`
  and `--worker-registration-grace-seconds`, whose defaults are 120 s and 3600 s): an engine that registered and never
  pinged is reaped, and later requests hang (LMCache #4715, #4795). It runs first, before any load.
Each fault is watched for `observe_s` after its injection, then the next one follows on the same pod. Two settings are
compared: the chart's (`lmcache.resilience`) and upstream's defaults (`kv_load_failure_policy=fail`, no restart hold,
no warm-up), so the table shows what each setting buys.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glm53.errors import EXIT_USAGE, Glm53Error
from glm53.faults.load import Load, LoadShape
from glm53.faults.table import FaultRow, FaultWindow, row
from glm53.lifecycle import Kubelet, kubelet
from glm53.pod import ENGINE, SIDECAR, PodAddresses, PodOptions, render_plans, started_pod
from glm53.profiles import ModelProfile

IDLE_S = 45.0
SHORT_REAP_S = 30.0  # lmcache 0.5.6 config.py:510-527: the reap timeout must be >= 3 x the 10 s heartbeat interval
FREEZE_S = 30.0
SLOW_RESTART_S = 35.0
# Upstream's defaults where the chart differs (charts/glm53/values.yaml, lmcache.resilience).
UPSTREAM_RESILIENCE = {"kvLoadFailurePolicy": "fail", "restartHoldSeconds": 0, "warmUp": False}
SETTINGS = ("chart", "upstream")
# A fault's window ends once this many reloads after the hits came back were seen (or at its observe_s).
CONFIRMING_RELOADS = 3
# vLLM's local KV cache on the fault pod (real engine): 96 blocks of 64 tokens, a few documents only, so reloads come
# from LMCache; vLLM refuses a cache smaller than one request of the model's length, hence the shorter context.
LOCAL_BLOCKS = 96
LOCAL_MAX_MODEL_LEN = 4096


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
    )
}


def parse_faults(names: Sequence[str]) -> list[Fault]:
    """The named faults in the suite's order (`idle` first: it needs a pod that has served nothing)."""
    unknown = [name for name in names if name not in FAULTS]
    if unknown:
        raise Glm53Error(f"unknown fault {unknown[0]!r}; choose from {', '.join(FAULTS)}", EXIT_USAGE)
    return [fault for name, fault in FAULTS.items() if name in names]


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
    return values


def _signal_sidecar(loop: Kubelet, signum: int) -> None:
    """Signal the sidecar container's whole process group (the supervisor and the server), as a node would."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(loop.pod.process(SIDECAR).process.pid, signum)


def _inject(fault: Fault, loop: Kubelet, load: Load, say: Callable[[str], None]) -> None:
    """Do the fault; returns once it is done (a freeze is resumed, an idle spell is over)."""
    if fault.name == "idle":
        time.sleep(IDLE_S)
        load.resume()
    elif fault.name in ("kill", "kill-slow"):
        if fault.name == "kill-slow":
            loop.hold_next_restart(SIDECAR, SLOW_RESTART_S)
        _signal_sidecar(loop, signal.SIGKILL)
    elif fault.name == "term":
        _signal_sidecar(loop, signal.SIGTERM)
    elif fault.name == "freeze":
        _signal_sidecar(loop, signal.SIGSTOP)
        time.sleep(FREEZE_S)
        _signal_sidecar(loop, signal.SIGCONT)
    say(f"faults: {fault.name} done at t={load.now():.1f} s")


def run_suite(options: SuiteOptions, workdir: Path, say: Callable[[str], None]) -> list[FaultRow]:
    """Start the pod, then play each fault under load; one row per fault."""
    values = suite_values(options)
    pod_options = PodOptions(options.profile, options.engine, validation=False, chart=options.chart, values=values)
    plans = render_plans(pod_options)
    rows: list[FaultRow] = []
    with started_pod(plans, workdir, say) as pod:
        urls = PodAddresses.of(pod.plan)
        load = Load(
            urls.vllm,
            urls.lmcache,
            _served_model(pod.plan.container(ENGINE).served_argv),
            options.shape,
            int(pod.plan.container(SIDECAR).option("--chunk-size")),
            options.profile.strict_prefix,
            options.hang_s,
        )
        with kubelet(pod, say, clock=load.now) as loop:
            idle_first = options.faults[:1] and options.faults[0].name == "idle"
            load.start(paused=bool(idle_first))
            if not idle_first:
                time.sleep(options.warm_s)
            for fault in options.faults:
                injected = load.now()
                say(f"faults: t={injected:.1f} s: {fault.name}: {fault.summary}")
                _inject(fault, loop, load, say)
                rows.append(_watch(fault, injected, load.now(), loop, load))
                say(f"faults: {fault.name}: {rows[-1]}")
            outcomes = load.stop()
    (workdir / "outcomes.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return rows


def _watch(fault: Fault, injected: float, over: float, loop: Kubelet, load: Load) -> FaultRow:
    """The fault's row once hits are back and confirmed by further reloads, or at the end of its window."""
    while True:
        now = load.now()
        events = tuple(e for e in loop.restarts if injected <= e.at_s < now)
        again = tuple(e for e in loop.started_again if injected <= e.at_s < now)
        outcomes = load.snapshot()
        current = row(FaultWindow(fault.name, injected, now, events, over, again), outcomes)
        back = current.hits_back_s
        confirming = [
            o for o in outcomes if o.kind == "reload" and back is not None and (o.stored_at_s or 0) >= injected + back
        ]
        if len(confirming) >= CONFIRMING_RELOADS or now >= injected + fault.observe_s:
            return current
        time.sleep(2.0)


def _served_model(argv: Sequence[str]) -> str:
    """The engine's served model: `--served-model-name` if given, else the stand-in's model argument (vLLM's rule)."""
    return next((argv[i + 1] for i, part in enumerate(argv[:-1]) if part == "--served-model-name"), argv[3])
