"""The fault table's arithmetic (`glm53.pod.faults.table`) and the fault tool's bad input (`glm53 faults`)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from glm53.pod.faults.load import Outcome, StoredDocument
from glm53.pod.faults.suite import (
    FAULTS,
    REVISITED,
    SETTLED_S,
    Fault,
    parse_faults,
    pod_groups,
    settled_before,
    with_mq_timeout,
)
from glm53.pod.faults.table import (
    ALERTS_HEADER,
    CONFIRMING_RELOADS,
    FaultWindow,
    format_table,
    hits_confirmed,
    row,
    with_revisits,
)
from glm53.pod.kubelet import RestartEvent


def reload(started: float, stored_at: float, hits: int | None, result: str = "ok") -> Outcome:
    return Outcome(0, "reload", started, 0.2, result, stored_at, hits, 768)


def store(started: float, result: str = "ok") -> Outcome:
    return Outcome(0, "store", started, 0.4, result)


def test_a_row_counts_the_requests_in_its_window_and_when_whole_hits_came_back() -> None:
    outcomes = [
        store(5.0),  # before the fault: not counted
        reload(12.0, 2.0, 0),  # stored before the fault (lost with the server): not evidence either way
        store(12.5, "failed: HTTP 500"),
        reload(20.0, 14.0, 0),  # stored while the cache was dead
        store(21.0, "hung"),
        reload(40.0, 31.0, 768),  # stored 21 s after the fault and found whole: hits are back
        reload(45.0, 35.0, 512),  # after recovery, part of one missing
        store(70.0),  # after the window
    ]
    window = FaultWindow("kill", 10.0, 60.0, (RestartEvent(10.5, "lmcache", "exited with status 137"),))
    r = row(window, outcomes)
    assert (r.sent, r.failed, r.hung) == (6, 1, 1)
    assert r.hits_back_s == 21.0
    assert (r.hit_tokens, r.expected_tokens) == (768 + 512, 768 * 2)
    assert r.restarted == "lmcache x1"
    assert r.over_after_s == 0.0 and r.recovery_s == 21.0
    # The sidecar answered again 15 s after the fault: the recovery counts from there.
    again = FaultWindow("kill", 10.0, 60.0, window.restarts, started_again=(RestartEvent(25.0, "lmcache", "started"),))
    assert row(again, outcomes).over_after_s == 15.0 and row(again, outcomes).recovery_s == 6.0
    # A freeze is over when it is resumed.
    assert row(FaultWindow("freeze", 10.0, 60.0, (), over_s=40.0), outcomes).recovery_s == 0.0


def test_a_cache_that_never_came_back_says_never() -> None:
    r = row(FaultWindow("kill", 0.0, 60.0, ()), [reload(30.0, 20.0, 0)])
    assert r.hits_back_s is None and r.recovery_s is None and r.hit_share is None and r.restarted == "none"
    table = format_table("chart settings:", [r])
    assert table[0] == "chart settings:" and table[1].split()[:4] == ["fault", "sent", "failed", "hung"]
    assert "never" in table[3] and "0/0" in table[3]


def test_a_watch_ends_once_whole_hits_are_back_and_confirmed_by_later_reloads() -> None:
    window = FaultWindow("kill", 10.0, 90.0, ())
    lost = [reload(12.0, 2.0, 0), reload(20.0, 14.0, 0)]  # stored before the fault, and while the cache was dead
    back = [reload(40.0 + 5 * i, 31.0 + 5 * i, 768) for i in range(CONFIRMING_RELOADS)]  # whole from 21 s on
    assert not hits_confirmed(row(window, lost), window, lost)
    unconfirmed = lost + back[:-1]
    assert not hits_confirmed(row(window, unconfirmed), window, unconfirmed)
    confirmed = lost + back
    assert hits_confirmed(row(window, confirmed), window, confirmed)


def test_faults_run_in_the_suites_order_whatever_the_lists() -> None:
    assert [f.name for f in parse_faults(["kill-slow", "idle", "kill"])] == ["idle", "kill", "kill-slow"]
    assert next(iter(FAULTS)) == "idle"
    # A fault at engine start is played while its pod starts: first, whatever the list says.
    assert [f.name for f in parse_faults(["kill", "absent", "idle"])] == ["absent", "idle", "kill"]


def names(groups: list[tuple[Fault, ...]]) -> list[list[str]]:
    return [[f.name for f in group] for group in groups]


def test_a_fault_at_engine_start_gets_its_pod_and_shares_it_unless_idle_needs_a_fresh_one() -> None:
    assert names(pod_groups(parse_faults(["kill", "absent"]))) == [["absent", "kill"]]
    assert names(pod_groups(parse_faults(["kill", "absent", "idle"]))) == [["absent"], ["idle", "kill"]]
    assert names(pod_groups(parse_faults(["absent-long", "absent", "term"]))) == [["absent"], ["absent-long", "term"]]
    assert names(pod_groups(parse_faults(["idle", "kill"]))) == [["idle", "kill"]]


def test_the_shortened_mq_timeout_goes_into_the_rendered_connector_config() -> None:
    """The chart renders no `lmcache.mp.mq_timeout` (upstream's 300 s holds); an `absent` pod's engine gets one."""
    from glm53.pod.contract import ENGINE_CONTAINER
    from glm53.pod.main_job import PodOptions, engine_and_profile, render_plans

    engine, profile = engine_and_profile("standin", None, None)
    plan = render_plans(PodOptions(profile, engine, validation=False)).serving
    argv = plan.container(ENGINE_CONTAINER).argv
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert "lmcache.mp.mq_timeout" not in config["kv_connector_extra_config"]
    shortened = with_mq_timeout(plan, 30.0).container(ENGINE_CONTAINER).argv
    extra = json.loads(shortened[shortened.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra == {**config["kv_connector_extra_config"], "lmcache.mp.mq_timeout": 30.0}
    assert [c.argv for c in with_mq_timeout(plan, 30.0).containers if c.name != ENGINE_CONTAINER] == [
        c.argv for c in plan.containers if c.name != ENGINE_CONTAINER
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--faults", "explode"], "unknown fault 'explode'"),
        (["--clients", "0"], "--clients must be at least 1"),
        (["--engine", "vllm", "--profile", "glm53"], "tiny CPU test model"),
        (["--engine", "standin", "--faults", "kill,absent"], "the absent faults need --engine vllm"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "glm53", "faults", *args], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


def revisit(hits: int | None, result: str = "ok") -> Outcome:
    return Outcome(-1, "revisit", 80.0, 0.3, result, 3.0, hits, 768)


def test_documents_stored_before_the_fault_count_as_sent_and_say_what_the_cache_kept() -> None:
    r = row(FaultWindow("kill", 10.0, 60.0, ()), [store(12.0)])
    kept = with_revisits(r, [revisit(768), revisit(512), revisit(None, "failed: HTTP 500")])
    assert (kept.sent, kept.failed, kept.hung) == (4, 1, 0)
    assert (kept.kept_tokens, kept.kept_expected) == (768 + 512, 768 * 3)
    assert kept.kept_share == pytest.approx(1280 / 2304)
    assert "1280/2304 (56%)" in format_table("t", [kept])[3]
    # No document sent again (nothing was stored before the fault): the row is unchanged and the column says so.
    assert with_revisits(r, []) == r and r.kept_share is None and format_table("t", [r])[3].split()[-2] == "-"


def test_only_documents_settled_before_the_fault_are_sent_again() -> None:
    stored = [StoredDocument(f"p{i}", f"s{i}", float(i)) for i in range(10)]
    chosen = settled_before(stored, injected_s=12.0)  # settled: stored by 12 - SETTLED_S
    assert [d.salt for d in chosen] == [f"s{i}" for i in range(int(12.0 - SETTLED_S) - REVISITED + 1, 8)]
    assert len(chosen) == REVISITED and all(d.stored_at_s <= 12.0 - SETTLED_S for d in chosen)
    assert settled_before(stored, injected_s=2.0) == []


def test_the_alerts_column_shows_only_when_a_prometheus_watched_and_dashes_a_fault_it_did_not() -> None:
    r = row(FaultWindow("kill", 0.0, 60.0, ()), [])
    watched = dataclasses.replace(r, fault="freeze", alerts="Glm53LMCacheUnreachable pending, cleared")
    assert ALERTS_HEADER not in format_table("t", [r])[1]
    table = format_table("t", [r, watched])
    assert table[1].endswith(ALERTS_HEADER)
    assert table[3].endswith(" -") and table[4].endswith("Glm53LMCacheUnreachable pending, cleared")
