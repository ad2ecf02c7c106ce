"""Benchmark of the startup probe's cost on a big log: full scan versus follow-up invocation, and a cold start.

Issue 2's targets: on a 1 GiB decorated vLLM log a follow-up invocation (state saved, a few lines appended) must be at
least 100x faster than the full first scan, and a cold invocation on a small log must take under 150 ms wall. Every
invocation goes through the real command line (the `glm53` console script) in a subprocess, because
interpreter start-up and imports are part of what the kubelet pays. Prints the figures; asserts nothing.

Run: `.venv/bin/python benchmarks/probe_bench.py [--size-mib 1024]`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "logs"
# The generated example log (vLLM's and LMCache's own formatters) the big log is made of.
HEALTHY = (EXAMPLES / "glm53-flash" / "healthy" / "vllm.log").read_bytes().split(b"\n")[:-1]
GEOMETRY = next(line for line in HEALTHY if b"Resolved LMCache MP geometry" in line) + b"\n"


def _noise_block(size: int) -> bytes:
    """About `size` bytes of the example's vLLM lines that carry no fact, as a debug-level log is mostly made of."""
    noise = [line + b"\n" for line in HEALTHY if line.startswith((b"(Worker_TP", b"(EngineCore pid="))]
    out, total, i = [], 0, 0
    while total < size:
        line = noise[i % len(noise)]
        out.append(line)
        total += len(line)
        i += 1
    return b"".join(out)


def write_big_log(path: Path, size_mib: int) -> None:
    """A log of `size_mib` MiB: the example's start up to its geometry, noise, then 4 of the 5 geometry lines."""
    head = b"".join(line + b"\n" for line in HEALTHY[: HEALTHY.index(GEOMETRY[:-1])])
    block = _noise_block(1024 * 1024)
    with path.open("wb") as handle:
        handle.write(head)
        for _ in range(size_mib):
            handle.write(block)
        handle.write(GEOMETRY * 4)


def glm53_command() -> list[str]:
    """The `glm53` console script the kubelet runs, from this interpreter's environment (else `python -m glm53`)."""
    script = Path(sys.executable).parent / "glm53"
    return [str(script)] if script.exists() else [sys.executable, "-m", "glm53"]


def timed_probe(log: Path, state_dir: Path, *extra: str) -> tuple[float, int, str]:
    args = ["--profile", "glm53-flash", "--chunk-size", "1152", "--log", str(log), "--state-dir", str(state_dir)]
    start = time.perf_counter()
    result = subprocess.run(
        [*glm53_command(), "probe", "startup", *args, *extra], capture_output=True, text=True, check=False
    )
    return time.perf_counter() - start, result.returncode, result.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mib", type=int, default=1024, help="size of the big log (default 1024 = 1 GiB)")
    parser.add_argument("--cold-runs", type=int, default=7, help="cold invocations on a small log (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="glm53-probe-bench-") as temp:
        root = Path(temp)
        log = root / "vllm.log"
        start = time.perf_counter()
        write_big_log(log, args.size_mib)
        print(f"wrote {log.stat().st_size / 2**30:.2f} GiB decorated log in {time.perf_counter() - start:.1f} s")

        # The full scan without the per-invocation time budget, so it reads the whole log in one go.
        full, code, message = timed_probe(log, root / "state", "--time-budget", "0")
        print(f"full scan:   {full * 1000:9.1f} ms  exit {code}  {message[:100]}")
        with log.open("ab") as handle:
            handle.write(GEOMETRY)  # the scheduler's line, the fifth
        follow, code, message = timed_probe(log, root / "state")
        print(f"follow-up:   {follow * 1000:9.1f} ms  exit {code}  {message[:100]}")
        print(f"ratio full/follow-up: {full / follow:.0f}x (target >= 100x)")

        small = [EXAMPLES / "glm53-flash" / "healthy" / "vllm.log"]
        colds = [timed_probe(small[0], root / f"cold-{i}")[0] for i in range(args.cold_runs)]
        print(
            f"cold invocation on a {small[0].stat().st_size} B log: median {statistics.median(colds) * 1000:.1f} ms, "
            f"max {max(colds) * 1000:.1f} ms over {len(colds)} runs (target < 150 ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
