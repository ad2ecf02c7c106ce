"""Scraping upstreams over real loopback HTTP: good pages parse, every kind of broken upstream is one error reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.exporter.upstream import (
    REASON_HTTP_STATUS,
    REASON_MALFORMED,
    REASON_UNREACHABLE,
    UpstreamError,
    metrics_url,
    parse_exposition,
    restarted,
    scrape,
)
from tests.support.exporter_fakes import (
    FIXTURES,
    LMCACHE_PAGE,
    VLLM_PAGE,
    free_port,
    http_pages,
    silent_listener,
    with_value,
)
from tests.support.real_lmcache import capture


def test_a_metrics_page_is_scraped_and_summed_over_label_sets() -> None:
    page = VLLM_PAGE + 'vllm:external_prefix_cache_hits_total{engine="1",model_name="zai-org/GLM-5.3-Flash"} 36.0\n'
    with http_pages({"/metrics": (200, page)}) as base:
        snapshot = scrape(metrics_url(base))
    assert snapshot.total("vllm:external_prefix_cache_hits_total") == 8064 + 36
    assert snapshot.total("vllm:no_such_metric_total") is None


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (500, "internal error", REASON_HTTP_STATUS),
        (200, "<html><body>LMCache admin</body></html>\n", REASON_MALFORMED),
        (200, 'vllm:prefix_cache_hits_total{engine="0" 5\n', REASON_MALFORMED),
    ],
)
def test_a_broken_upstream_is_one_error_with_its_reason(status: int, body: str, reason: str) -> None:
    with http_pages({"/metrics": (status, body)}) as base, pytest.raises(UpstreamError) as caught:
        scrape(f"{base}/metrics")
    assert caught.value.reason == reason


def test_a_closed_port_is_unreachable() -> None:
    with pytest.raises(UpstreamError) as caught:
        scrape(f"http://127.0.0.1:{free_port()}/metrics", timeout=1.0)
    assert caught.value.reason == REASON_UNREACHABLE


def test_a_hung_upstream_costs_one_timeout_and_is_unreachable() -> None:
    with silent_listener() as base, pytest.raises(UpstreamError) as caught:
        scrape(f"{base}/metrics", timeout=0.2)
    assert caught.value.reason == REASON_UNREACHABLE
    assert "timed out" in caught.value.detail


def test_metrics_url_appends_the_path_only_to_a_bare_address() -> None:
    assert metrics_url("http://127.0.0.1:9090") == "http://127.0.0.1:9090/metrics"
    assert metrics_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://127.0.0.1:8000/custom/metrics") == "http://127.0.0.1:8000/custom/metrics"


def test_a_url_without_scheme_is_refused_with_a_sentence() -> None:
    with pytest.raises(Glm53Error) as caught:
        metrics_url("127.0.0.1:9090")
    assert caught.value.message == (
        "expected an http(s) URL such as http://127.0.0.1:8000, got '127.0.0.1:9090'; fix the URL flag"
    )


def test_restart_evidence() -> None:
    before = parse_exposition(LMCACHE_PAGE)
    assert not restarted(before, before)
    grown = parse_exposition(with_value(LMCACHE_PAGE, "lmcache_mp_lookup_requested_tokens_total", 20000.0))
    assert not restarted(before, grown)
    assert restarted(grown, before)  # a counter went backwards
    new_process = parse_exposition(with_value(LMCACHE_PAGE, "process_start_time_seconds", 1.7964e09))
    assert restarted(before, new_process)
    lines = LMCACHE_PAGE.splitlines(keepends=True)
    vanished = parse_exposition("".join(line for line in lines if "lookup_hit_tokens" not in line))
    assert restarted(before, vanished)


# Lifecycle histograms of a sample of chunks and blocks (1 % by default): whether one request's page has them depends on
# which keys the sample takes (a per-process `hash(key)`, or `random.random()` for L0), so they are not part of the
# page's fixed shape. lmcache 0.5.6 lmcache/v1/mp_observability/subscribers/metrics/l0_lifecycle.py:102-123,289-290,
# l1_lifecycle.py:88-122,198-199, sm_lifecycle.py:67-84 (OTel names; Prometheus appends the unit, e.g. `_seconds`).
SAMPLED_FAMILY_PREFIXES = (
    "lmcache_mp_l0_block_lifetime",
    "lmcache_mp_l0_block_idle_before_evict",
    "lmcache_mp_l0_block_reuse_gap",
    "lmcache_mp_l1_chunk_lifetime",
    "lmcache_mp_l1_chunk_idle_before_evict",
    "lmcache_mp_l1_chunk_reuse_gap",
    "lmcache_mp_l1_chunk_evict_reuse_gap",
    "lmcache_mp_real_reuse_gap",
)


def _lmcache_families(page: str) -> set[tuple[str, str]]:
    return {(f.name, f.type) for f in parse_exposition(page).families if f.name.startswith("lmcache_")}


def _fixed_families(page: str) -> set[tuple[str, str]]:
    """The families every such page has, whichever chunks the lifecycle sample took."""
    return {family for family in _lmcache_families(page) if not family[0].startswith(SAMPLED_FAMILY_PREFIXES)}


@pytest.mark.slow
def test_the_fixture_has_the_real_servers_families(tmp_path: Path) -> None:
    """The released `lmcache server` still exposes exactly the fixed families of `fixtures/lmcache-metrics.prom` (the
    sampled lifecycle histograms aside), on its HTTP port, with the seed's numbers after one bench request; if not,
    regenerate the fixture (fixtures/README.md)."""
    page = capture(tmp_path)
    assert _fixed_families(page) == _fixed_families((FIXTURES / "lmcache-metrics.prom").read_text())
    # A sampled family, when the sample took a chunk of this request, is one of the lifecycle histograms.
    assert {kind for _, kind in _lmcache_families(page) - _fixed_families(page)} <= {"histogram"}
    snapshot = parse_exposition(page)
    assert snapshot.total("lmcache_mp_lookup_requested_tokens_total") == 2 * 8064
    assert snapshot.total("lmcache_mp_lookup_hit_tokens_total") == 8064
