"""The collector's output, read back with `registry.get_sample_value` (each call is one scrape)."""

from __future__ import annotations

from pathlib import Path

import pytest
from exporter_fakes import LMCACHE_PAGE, LMCACHE_URL, VLLM_PAGE, VLLM_URL, copy_logs, wired

from glm53.exporter.upstream import REASON_MALFORMED, REASON_UNREACHABLE, UpstreamError


def _one_geometry_log(directory: Path, groups: str, block: int | None) -> Path:
    """A log of one undecorated-rank process (EngineCore) with an optional N line and one geometry line."""
    log = directory / "vllm.log"
    lines = [
        f"(EngineCore_DP0 pid=9) INFO 11-29 07:00:05 [config.py:228] Setting attention block size to {block} tokens"
    ]
    lines = lines if block is not None else []
    lines.append(
        "(EngineCore_DP0 pid=9) INFO 11-29 07:00:09 [c.py:1] Resolved LMCache MP geometry: "
        f"group_tokens_per_block=[{groups}], scheduler_block_size=64, cache_model_name=zai-org/GLM-5.3"
    )
    log.write_text("\n".join(lines) + "\n")
    return log


def test_geometry_facts_of_glm53_flash_at_tp4(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, _):
        value = registry.get_sample_value
        assert value("glm53_effective_chunk_size_tokens") == 1152
        assert value("glm53_configured_chunk_size_tokens") == 256  # the negotiating server's configured_min
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
        # 07:00:01 first line -> 07:02:11 geometry line
        assert value("glm53_geometry_resolved_after_start_seconds") == 130
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
    log = _one_geometry_log(tmp_path, "576, 576, 576, 576, 576, 0", 576)
    # No N was measured at TP 2, so the logged 576 is the expectation and the groups match it...
    with wired([log], tp=2, chunk=1152) as (registry, _):
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 1
    # ...but at TP 4 the profile says N = 1152.
    with wired([log], tp=4, chunk=1152) as (registry, _):
        assert registry.get_sample_value("glm53_geometry_matches_profile") == 0
        assert registry.get_sample_value("glm53_probe_status", {"status": "wrong"}) == 1
        assert registry.get_sample_value("glm53_attention_block_size_tokens") == 576


def test_groups_of_another_model_get_kind_unknown(tmp_path: Path) -> None:
    log = _one_geometry_log(tmp_path, "64", None)
    with wired([log], tp=1) as (registry, _):
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
        assert value("glm53_strict_prefix_bound_tokens_total") == 16128
        # Cold run: 0 of its bound of 8064; after the reset: all 8064. Half the summed bound was achieved.
        assert value("glm53_strict_prefix_bound_achieved_ratio") == 0.5


def test_lmcache_families_are_passed_through(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, _):
        assert registry.get_sample_value("lmcache_mp_l1_memory_usage_bytes") == 6291456
        labels = {"model_name": "zai-org/GLM-5.3-Flash", "cache_salt": ""}
        assert registry.get_sample_value("lmcache_mp_lookup_hit_tokens_total", labels) == 8064
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
        fake.pages[LMCACHE_URL] = LMCACHE_PAGE.replace("16128.0", "0.0").replace("1.7963e+09", "1.7964e+09")
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "lmcache"}) == 1
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "lmcache"}) == 1
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "vllm"}) == 0


def test_a_vllm_restart_shows_as_counters_going_backwards(tmp_path: Path) -> None:
    with wired(list(copy_logs(tmp_path))) as (registry, fake):
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "vllm"}) == 0
        fake.pages[VLLM_URL] = VLLM_PAGE.replace("8064.0", "0.0")
        assert registry.get_sample_value("glm53_upstream_restarts_total", {"target": "vllm"}) == 1


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "logs"


@pytest.mark.parametrize(
    ("scenario", "profile", "tp", "chunk", "status", "matches"),
    [
        ("glm53-flash/healthy", "glm53-flash", 4, 1152, "ready", 1),
        ("glm53-flash/negotiated", "glm53-flash", 4, 256, "ready", 1),
        ("glm53-flash/loading", "glm53-flash", 4, 1152, "not_yet", None),
        ("glm53-flash/wrong-chunk", "glm53-flash", 4, 256, "wrong", None),
        ("glm53-flash/ranks-disagree", "glm53-flash", 4, 1152, "wrong", None),
        ("glm53/healthy", "glm53", 8, 256, "ready", 1),
    ],
)
def test_the_example_logs_give_the_probes_verdict(
    scenario: str, profile: str, tp: int, chunk: int, status: str, matches: int | None
) -> None:
    logs = sorted((EXAMPLES / scenario).glob("*.log"))
    with wired(logs, profile=profile, tp=tp, chunk=chunk) as (registry, _):
        assert registry.get_sample_value("glm53_probe_status", {"status": status}) == 1
        if matches is not None:
            assert registry.get_sample_value("glm53_geometry_matches_profile") == matches
            assert registry.get_sample_value("glm53_effective_chunk_size_tokens") == (1152 if tp == 4 else 256)
