"""Benchmark: the README's main job stays under 60 s, and the whole CPU pod under 3 GiB of resident memory.

Why: the main job is what a newcomer runs first and what CI runs for both profiles; with the real LMCache server as
the sidecar (torch and LMCache imported twice: by the server and by the engine stand-in) both its duration and its
memory could creep up unnoticed. The server's L1 lives in /dev/shm (`--shm-name`) and the stand-in's KV tensors are
a few bytes per token, so neither should count much.

What is measured (on this machine, printed with the numbers): `glm53 pod --profile P` run --runs times as a user runs
it; while it runs, every 0.2 s the resident set (VmRSS) of every process it started (found by an environment marker
they all inherit, whatever their parentage) is summed; printed per run: the LMCache server's start-up time (spawn to
/healthcheck) and the pod's total as the pod reports them, the wall time of the command, the peak summed RSS and the
largest single process; then the ratios to the targets (60 s, 3 GiB).

Run: ``.venv/bin/python benchmarks/pod_bench.py [--profile glm53-flash] [--runs 1]``.
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

from glm53.profiles import DEFAULT_PROFILE, PROFILES

MARKER = "GLM53_POD_BENCH_MARKER"
TARGET_SECONDS = 60.0
TARGET_RSS_BYTES = 3 * 1024**3
GIB = 1024**3
SUMMARY = re.compile(r"pod: (PASS|FAIL) in ([\d.]+) s \(LMCache server start-up ([\d.]+) s;")


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


def run_once(profile: str) -> tuple[str, float, float, float, Sample]:
    marker = uuid.uuid4().hex
    sample = Sample()
    done = threading.Event()
    sampler = threading.Thread(target=sample_until, args=(done, marker, sample))
    sampler.start()
    started = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "glm53", "pod", "--profile", profile],
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
            env={**os.environ, MARKER: marker},
        )
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - started
    match = SUMMARY.search(result.stdout)
    if match is None:
        raise SystemExit(f"glm53 pod did not report its summary (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return match.group(1), float(match.group(2)), float(match.group(3)), wall, sample


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=list(PROFILES))
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"glm53 pod --profile {args.profile}, {args.runs} run(s) on {os.cpu_count()} CPUs")
    worst_total, worst_rss = 0.0, 0
    for index in range(1, args.runs + 1):
        verdict, total, startup, wall, sample = run_once(args.profile)
        worst_total, worst_rss = max(worst_total, wall), max(worst_rss, sample.peak_total)
        print(
            f"run {index}: {verdict}; LMCache server start-up {startup:.1f} s, pod total {total:.1f} s "
            f"(command wall time {wall:.1f} s); peak RSS of the pod's processes {sample.peak_total / GIB:.2f} GiB "
            f"(largest process {sample.peak_single / GIB:.2f} GiB)"
        )
    print(f"target {TARGET_SECONDS:.0f} s: slowest wall time / target = {worst_total / TARGET_SECONDS:.2f}")
    print(f"target 3 GiB: peak RSS / target = {worst_rss / TARGET_RSS_BYTES:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
