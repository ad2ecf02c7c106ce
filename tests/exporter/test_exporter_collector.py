"""The collector's output, read back with `registry.get_sample_value` (each call is one scrape)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from glm53 import cli
from glm53.exporter.upstream import REASON_MALFORMED, REASON_UNREACHABLE, UpstreamError
from glm53.probe.judge import EXIT_NOT_YET, EXIT_READY, EXIT_WRONG
from glm53.profiles import get_profile
from tests.support.exporter_fakes import (
    LMCACHE_PAGE,
    LMCACHE_URL,
    VLLM_PAGE,
    VLLM_URL,
    copy_logs,
    geometry_lines,
    vllm_page,
    wired,
    with_value,
)


def _one_geometry_log(directory: Path, groups: list[int], block: int | None, tp: int) -> Path:
    """A vLLM log with an optional N line and the TP + 1 geometry lines of one start (scheduler and each worker)."""
    log = directory / "vllm.log"
    n_line = (
        f"(APIServer pid=1) INFO 11-29 07:00:05 [interface.py:1108] Setting attention block size to {block} tokens\n"
    )
    geometry = geometry_lines(groups, 64, datetime(2026, 11, 29, 7, 0, 9), count=tp + 1)
    log.write_text((n_line if block is not None else "") + geometry)
    return log


def test_geometry_facts_of_glm53_flash_at_tp4(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, _):
        value = registry.get_sample_value
        assert value("glm53_effective_chunk_size_tokens") == 1152
        assert value("glm53_configured_chunk_size_tokens") == 1152  # released 0.5.6 negotiates nothing
        assert value("glm53_required_alignment_tokens") == 1152
        assert value("glm53_attention_block_size_tokens") == 1152
        assert value("glm53_scheduler_block_size_tokens") == 1152
        for index in range(4):
            assert value("glm53_cache_group_tokens_per_block", {"index": str(index), "kind": "kda_state"}) == 1152
        assert value("glm53_cache_group_tokens_per_block", {"index": "4", "kind": "sparse_mla_indexer"}) == 1152
        assert value("glm53_cache_group_tokens_per_block", {"index": "5", "kind": "kpool_tail_scratch"}) == 0
        assert value("glm53_geometry_matches_profile") == 1
        assert value("glm53_probe_status", {"status": "ready"}) == 1
        assert value("glm53_probe_status", {"status": "wrong"}) == 0
        assert (value("glm53_geometry_resolved_after_start_seconds") or -1) >= 0
        info = {
            "profile": "glm53-flash",
            "group_tokens_per_block": "1152,1152,1152,1152,1152,0",
            "cache_model_name": "zai-org/GLM-5.3-Flash",
        }
        assert value("glm53_geometry_info", info) == 1


def test_without_negotiation_the_configured_flag_is_the_effective_size(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    with wired([vllm], chunk=1152) as (registry, _):
        assert registry.get_sample_value("glm53_configured_chunk_size_tokens") == 1152
        assert registry.get_sample_value("glm53_effective_chunk_size_tokens") == 1152
        assert registry.get_sample_value("glm53_probe_status", {"status": "ready"}) == 1


def test_a_chunk_size_off_the_alignment_is_wrong_while_the_groups_match(tmp_path: Path) -> None:
    vllm, _ = copy_logs(tmp_path)
    with wired([vllm], chunk=256) as (registry, _):
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 1
        assert registry.get_sample_value("glm53_probe_status", {"status": "wrong"}) == 1


def test_n_of_another_tp_size_matches_only_where_the_profile_measured_none(tmp_path: Path) -> None:
    log = _one_geometry_log(tmp_path, [576, 576, 576, 576, 576, 0], 576, tp=2)
    # No N was measured at TP 2, so the logged 576 is the expectation and the groups match it...
    with wired([log], tp=2, chunk=1152) as (registry, _):
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 1
    # ...but at TP 4 the profile says N = 1152.
    with wired([log], tp=4, chunk=1152) as (registry, _):
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 0
        assert registry.get_sample_value("glm53_probe_status", {"status": "wrong"}) == 1
        assert registry.get_sample_value("glm53_attention_block_size_tokens") == 576


def test_groups_of_another_model_get_kind_unknown(tmp_path: Path) -> None:
    log = _one_geometry_log(tmp_path, [64], None, tp=8)
    with wired([log], tp=8) as (registry, _):
        assert registry.get_sample_value("glm53_cache_group_tokens_per_block", {"index": "0", "kind": "unknown"}) == 64
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 0
    with wired([log], profile="glm53", tp=8, chunk=256) as (registry, _):
        assert registry.get_sample_value("glm53_cache_group_tokens_per_block", {"index": "0", "kind": "dsa_mla"}) == 64
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 1
        assert registry.get_sample_value("glm53_probe_status", {"status": "ready"}) == 1


def test_before_the_geometry_line_facts_are_absent_and_the_probe_says_not_yet(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("(APIServer pid=1) INFO 11-29 07:00:01 [api_server.py:1] vLLM API server version 0.33.0\n")
    with wired([log, tmp_path / "missing.log"]) as (registry, _):
        assert registry.get_sample_value("glm53_geometry_matches_profile") is None
        assert registry.get_sample_value("glm53_scheduler_block_size_tokens") is None
        assert registry.get_sample_value("glm53_geometry_resolved_after_start_seconds") is None
        assert registry.get_sample_value("glm53_probe_status", {"status": "not_yet"}) == 1


def test_hit_ratios_served_tokens_and_strict_prefix_share(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, _):
        value = registry.get_sample_value
        assert value("glm53_prefix_cache_hit_ratio", {"scope": "local"}) == 0
        assert value("glm53_prefix_cache_hit_ratio", {"scope": "external"}) == pytest.approx(8064 / 17014)
        assert value("glm53_prefix_cache_hit_tokens_total", {"scope": "external"}) == 8064
        assert value("glm53_prefix_cache_queried_tokens_total", {"scope": "external"}) == 17014
        # LMCache found 8064 tokens (the second lookup); the cold lookup found nothing and counts on neither side.
        assert value("glm53_strict_prefix_bound_tokens_total") == 8064
        assert value("glm53_strict_prefix_bound_achieved_ratio") == 1.0


def test_a_full_prompt_hit_of_a_single_group_model_is_just_below_one(tmp_path: Path) -> None:
    """GLM-5.3 at C = 256, a 768-token prompt held in full: LMCache finds 768, the connector loads 767."""
    lmcache = with_value(LMCACHE_PAGE, "lmcache_mp_lookup_hit_tokens_total", 768.0)
    pages = {VLLM_URL: vllm_page(1536, 0, 1536, 767), LMCACHE_URL: lmcache}
    with wired(list(copy_logs(tmp_path)), pages) as (registry, _):
        assert registry.get_sample_value("glm53_strict_prefix_bound_achieved_ratio") == 767 / 768


def test_held_chunks_that_never_reached_vllm_pull_the_ratio_down(tmp_path: Path) -> None:
    """LMCache found 8064 tokens twice, but vLLM loaded them once (the other load failed and was recomputed)."""
    lmcache = with_value(LMCACHE_PAGE, "lmcache_mp_lookup_hit_tokens_total", 16128.0)
    with wired(list(copy_logs(tmp_path)), {VLLM_URL: VLLM_PAGE, LMCACHE_URL: lmcache}) as (registry, _):
        assert registry.get_sample_value("glm53_strict_prefix_bound_achieved_ratio") == 0.5


def test_lmcache_families_are_passed_through(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, _):
        l1 = {"backend": "dram", "l1_tag": "_default"}
        assert (registry.get_sample_value("lmcache_mp_l1_memory_usage_bytes", l1) or 0) > 0
        labels = {"model_name": "test-model", "cache_salt": ""}  # the name LMCache's bench registers with
        assert registry.get_sample_value("lmcache_mp_lookup_hit_tokens_total", labels) == 8064
        assert registry.get_sample_value("lmcache_mp_num_finished_stores_total", {"device": "cpu"}) == 1
        assert registry.get_sample_value("process_start_time_seconds") is None  # not one of LMCache's own families


def test_unreachable_and_broken_upstreams_count_errors_and_keep_the_log_facts(tmp_path: Path) -> None:
    pages: dict[str, str | UpstreamError] = {
        VLLM_URL: UpstreamError(REASON_UNREACHABLE, "connection refused"),
        LMCACHE_URL: UpstreamError(REASON_MALFORMED, "not Prometheus text exposition"),
    }
    with wired(list(copy_logs(tmp_path)), pages) as (registry, _):
        value = registry.get_sample_value
        assert value("glm53_upstream_errors_total", {"target": "vllm", "reason": "unreachable"}) == 1
        assert value("glm53_upstream_errors_total", {"target": "vllm", "reason": "unreachable"}) == 2  # per scrape
        assert value("glm53_upstream_errors_total", {"target": "lmcache", "reason": "malformed"}) == 3
        assert value("glm53_upstream_errors_total", {"target": "lmcache", "reason": "unreachable"}) == 0
        assert value("glm53_upstream_up", {"target": "vllm"}) == 0
        assert value("glm53_upstream_up", {"target": "lmcache"}) == 0
        assert value("glm53_prefix_cache_hit_ratio", {"scope": "external"}) is None
        assert value("glm53_effective_chunk_size_tokens") == 1152
        assert value("glm53_scrape_duration_seconds") is not None


def test_healthy_upstreams_are_up_with_zero_errors(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, fake):
        assert registry.get_sample_value("glm53_upstream_up", {"target": "vllm"}) == 1
        labels = {"target": "lmcache", "reason": "malformed"}
        assert registry.get_sample_value("glm53_upstream_errors_total", labels) == 0
        assert fake.calls == 4  # two scrapes, each of both upstreams


def test_an_lmcache_restart_is_counted_once(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, fake):
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "lmcache"}) == 0
        restarted = with_value(LMCACHE_PAGE, "lmcache_mp_lookup_requested_tokens_total", 0.0)
        fake.pages[LMCACHE_URL] = with_value(restarted, "process_start_time_seconds", 1.7964e09)
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "lmcache"}) == 1
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "lmcache"}) == 1
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "vllm"}) == 0


def test_a_vllm_restart_shows_as_counters_going_backwards(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, fake):
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "vllm"}) == 0
        fake.pages[VLLM_URL] = vllm_page(17014, 0, 17014, 0)
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "vllm"}) == 1


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"
PROBE_STATUS = {EXIT_READY: "ready", EXIT_NOT_YET: "not_yet", EXIT_WRONG: "wrong"}


@pytest.mark.parametrize(
    "scenario", sorted(str(d.relative_to(EXAMPLES)) for d in EXAMPLES.glob("*/*") if any(d.glob("*.log")))
)
def test_the_example_logs_give_the_probes_verdict(scenario: str, tmp_path: Path) -> None:
    """Whatever the examples show, the exporter's verdict is the one `glm53 probe startup` gives on the same logs."""
    profile = get_profile(scenario.split("/")[0])
    logs = sorted((EXAMPLES / scenario).glob("*.log"))
    chunk, tp = profile.recommended_chunk_size, profile.tensor_parallel_size
    flags = ["--profile", profile.name, "--chunk-size", str(chunk), "--state-dir", str(tmp_path)]
    exit_code = cli.main(["probe", "startup", *flags, *(arg for log in logs for arg in ("--log", str(log)))])
    with wired(logs, profile=profile.name, tp=tp, chunk=chunk) as (registry, _):
        assert registry.get_sample_value("glm53_probe_status", {"status": PROBE_STATUS[exit_code]}) == 1
