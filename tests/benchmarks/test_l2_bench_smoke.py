"""`benchmarks/l2_bench.py` still runs, at its smallest size on two configurations, and prints its table (no timing
is asserted: the figures are the benchmark's business)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "l2_bench.py"
NUMBER = r"\d+\.\d\d"
RATIO = r"(\d+\.\d\dx\*?|-)"


@pytest.mark.slow
def test_the_l2_benchmark_prints_a_row_per_configuration_and_phase_and_the_store_and_counter_lines() -> None:
    # Four server starts (two per configuration) of the real `lmcache server`: about 40 s on two cores.
    args = ["--configs", "off,fs", "--prompts", "2", "--chunks", "2", "--layers", "1", "--rounds", "1"]
    result = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()

    rows = [line for line in lines if re.match(r"(off|fs)\s+(L1 hit|L1 burst|L1 hit\+write|restart, L2|again)\s", line)]
    assert [tuple(re.split(r"\s{2,}", row)[:2]) for row in rows] == [
        (config, phase)
        for config in ("off", "fs")
        for phase in ("L1 hit", "L1 burst", "L1 hit+write", "restart, L2", "again")
    ], result.stdout
    row = re.compile(
        rf"(off|fs)\s+[A-Za-z0-9+, ]+?\s+\d+/\d+\s+{NUMBER}\s+{NUMBER}\s+\d+%\s+{RATIO}"
        rf"\s+({NUMBER}\s+{NUMBER}\s+{RATIO}|\(lookups only\)|\(a miss: nothing to retrieve\))"
    )
    assert all(row.fullmatch(line.strip()) for line in rows), result.stdout
    assert all(" 1.00x " in line for line in rows if line.startswith("off") and "restart" not in line), result.stdout

    counters = [line for line in lines if re.match(r"(off|fs)\s+\d+\.\d\d\s", line)]
    assert len(counters) == 2, result.stdout
    assert all(
        re.fullmatch(
            rf"(off|fs)\s+{NUMBER}\s+{NUMBER}\s+{RATIO}\s+L2 prefetch lookups \d+ \(\d+ chunks checked\), "
            r"hit keys L1 \d+ / L2 \d+",
            line.strip(),
        )
        for line in counters
    ), result.stdout
