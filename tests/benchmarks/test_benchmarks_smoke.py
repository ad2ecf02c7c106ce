"""The benchmark scripts still run: each at a tiny size, so they cannot rot between the runs that measure for real.

No timing is asserted here (targets are the benchmarks' business); only that each prints its figures and exits 0.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_probe_benchmark_prints_its_ratio_and_cold_start() -> None:
    out = run("probe_bench.py", "--size-mib", "8", "--cold-runs", "2")
    assert "ratio full/follow-up:" in out
    assert "cold invocation on a" in out


def test_exporter_benchmark_prints_its_scrape_figures() -> None:
    out = run("exporter_bench.py", "--log-gib", "0.01", "--scrapes", "5")
    assert "first scrape (reads the whole log):" in out
    assert "target 50 ms: p95 / target =" in out


@pytest.mark.slow
def test_routing_benchmark_prints_its_table_the_kill_and_its_ratio_last() -> None:
    # The stand-in engine at the smallest size (the real engines are the benchmark's own run: docs/operations.md).
    out = run(
        "routing_bench.py",
        *("--engine", "standin", "--replicas", "2", "--documents", "2", "--questions", "2", "--doc-chunks", "1"),
        *("--clients", "4"),
        timeout=420,
    )
    lines = out.strip().splitlines()
    assert re.fullmatch(r"hit tokens, cache-aware vs round-robin: \d+\.\d\d x", lines[-1]), out
    rows = [line.split() for line in lines if re.match(r"\s+4\s+(round_robin|cache_aware|kv_aware)\s", line)]
    assert [row[1] for row in rows] == ["round_robin", "cache_aware", "kv_aware"], out
    assert all(row[-2] == "0" for row in rows), out  # failed: the column before `requests per replica` (a/b)
    assert "no cache_salt" in lines[0], out
    killed = next(line for line in lines if line.startswith("killed replica"))
    # How many requests die with the replica depends on where they were; the figures are printed, not asserted.
    assert re.search(r"requests lost \d+, router retries \d+, out of the router's rotation", killed), out
