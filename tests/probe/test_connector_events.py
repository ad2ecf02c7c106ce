"""The link between the engine and its sidecar after Ready, as the real connector and server logged it: parsed by
`glm53.probe.logparse` and turned into the exporter's `glm53_sidecar_link_*` facts by `glm53.exporter.facts`.

The fixture lines were captured from a real run (tests/fixtures/logs/README.md): a SIGKILLed sidecar, held back on its
restart, after which the engine entered degraded mode, recovered and registered its KV caches again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from glm53.exporter.facts import LogWatch
from glm53.probe.logparse import ConnectorEvent, parse_lines
from glm53.profiles import get_profile

AFTER_READY = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "after-ready"


def events(name: str) -> list[str]:
    lines = (AFTER_READY / name).read_text().splitlines()
    return [r.event for r in parse_lines(lines) if isinstance(r, ConnectorEvent)]


def test_the_engines_heartbeat_edges_and_its_registering_again_are_recognised() -> None:
    seen = events("vllm.log")
    assert seen[:2] == ["degraded", "degraded"]  # the scheduler's adapter and the worker's, each once
    assert seen.count("recovered") >= 2 and "reregistered" in seen


def test_the_new_servers_refusal_of_an_unknown_engine_is_recognised() -> None:
    assert "store_rejected" in events("lmcache.log")


def test_the_exporter_counts_the_events_and_sees_degraded_mode_end(tmp_path: Path) -> None:
    vllm = tmp_path / "vllm.log"
    lines = (AFTER_READY / "vllm.log").read_text().splitlines(keepends=True)
    last_recovery = max(i for i, line in enumerate(lines) if "resuming normal operation" in line)
    vllm.write_text("".join(lines[: last_recovery + 1]))
    shutil.copy(AFTER_READY / "lmcache.log", tmp_path / "lmcache.log")
    watch = LogWatch([vllm, tmp_path / "lmcache.log"], get_profile("tiny-dense"), 1, 256)
    facts = watch.poll()
    counts = dict(facts.link_events)
    assert counts["degraded"] == 2 and counts["reregistered"] >= 1 and counts["store_rejected"] >= 1
    assert facts.link_degraded is False  # every adapter that went degraded recovered
    with vllm.open("a") as log:  # the next fault: degraded again, and it stays so
        log.writelines(line for line in lines[last_recovery + 1 :] if "degraded" in line)
    assert watch.poll().link_degraded is True
