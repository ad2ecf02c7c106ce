"""`benchmarks/stage_bench.py` still runs, at a tiny size, and prints its figures (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "stage_bench.py"


@pytest.mark.slow
def test_the_stage_benchmark_prints_rate_and_verification_overhead() -> None:
    command = [sys.executable, str(BENCH), "--files", "1", "--file-mib", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "run 1: downloaded " in out and "MiB/s); verification pass " in out
    assert "huggingface_hub's own snapshot_download of the same repository" in out
    assert "restart with the marker: " in out
    assert out.strip().splitlines()[-1].startswith("verification overhead (pass time / download time): ")
