"""The benchmark scripts still run: each at a tiny size, so they cannot rot between the runs that measure for real.

No timing is asserted here (targets are the benchmarks' business); only that each prints its figures and exits 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=120
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
