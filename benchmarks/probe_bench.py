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
FLASH_GROUPS = "[1152, 1152, 1152, 1152, 1152, 0]"


def _noise_block(size: int) -> bytes:
    """About `size` bytes of decorated vLLM lines that carry no fact, as a debug-level log is mostly made of."""
    lines = [
        "(EngineCore_DP0 pid=41) DEBUG 11-29 07:01:{s:02d} [core.py:812] EngineCore waiting for work; "
        "{i} requests in queue, kv cache usage 0.0%",
        "(Worker_TP{r} pid={pid}) DEBUG 11-29 07:01:{s:02d} [gpu_model_runner.py:2843] loaded shard {i} of "
        "model.safetensors (tensor layers.{i}.mlp.experts.w13_weight, 234881024 bytes)",
        '(APIServer pid=1) INFO:     127.0.0.1:{port} - "GET /health HTTP/1.1" 503 Service Unavailable',
    ]
    out, i = [], 0
    total = 0
    while total < size:
        line = lines[i % 3].format(s=i % 60, i=i, r=i % 4, pid=53 + i % 4, port=40000 + i % 20000) + "\n"
        out.append(line)
        total += len(line)
        i += 1
    return "".join(out).encode()


def _fact_lines(ranks: range) -> bytes:
    return "".join(
        f"(Worker_TP{r} pid={53 + r}) INFO 11-29 07:09:00 [lmcache_mp_connector.py:668] Resolved LMCache MP geometry: "
        f"group_tokens_per_block={FLASH_GROUPS}, scheduler_block_size=1152, cache_model_name=zai-org/GLM-5.3-Flash\n"
        for r in ranks
    ).encode()


def write_big_log(path: Path, size_mib: int) -> None:
    """A decorated log of `size_mib` MiB: the block-size line, noise, then geometry from ranks 0-2 (rank 3 later)."""
    block = _noise_block(1024 * 1024)
    with path.open("wb") as handle:
        handle.write(
            b"(APIServer pid=1) INFO 11-29 07:00:09 [config.py:228] Setting attention block size to 1152 tokens to "
            b"ensure that attention page size is >= mamba page size.\n"
        )
        for _ in range(size_mib):
            handle.write(block)
        handle.write(_fact_lines(range(3)))


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
            handle.write(_fact_lines(range(3, 4)))
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
