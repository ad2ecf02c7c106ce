"""The exporter with one LMCache server per TP rank (the chart's lmcache.serverLayout=perRank): one target per server,
LMCache's series kept apart by server, and the strict-prefix bound as the connector computes a hit, the minimum over
the servers (lmcache 0.5.6 lmcache/integration/vllm/vllm_multi_process_adapter.py:1054-1068)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from glm53.exporter import names
from glm53.exporter.collector import Glm53Collector, Upstream
from glm53.exporter.facts import LogWatch
from glm53.exporter.upstream import REASON_UNREACHABLE, UpstreamError
from glm53.profiles import get_profile
from tests.support.exporter_fakes import LMCACHE_PAGE, VLLM_PAGE, VLLM_URL, FakeUpstreams, copy_logs, with_value

SERVER_URLS = [f"http://127.0.0.1:{8090 + i}/metrics" for i in range(4)]
HIT = "lmcache_mp_lookup_hit_tokens_total"
LABELS = {"model_name": "test-model", "cache_salt": ""}


def registry_over(tmp_path: Path, pages: dict[str, str | UpstreamError]) -> tuple[CollectorRegistry, Glm53Collector]:
    upstreams = [Upstream(names.VLLM, VLLM_URL)]
    upstreams += [Upstream(t, u) for t, u in zip(names.lmcache_targets(4), SERVER_URLS, strict=True)]
    logs = LogWatch(list(copy_logs(tmp_path)), get_profile("glm53-flash"), 4, 1152)
    collector = Glm53Collector(logs, upstreams, FakeUpstreams({VLLM_URL: VLLM_PAGE, **pages}), lambda: 1)
    registry = CollectorRegistry()
    registry.register(collector)
    return registry, collector


def test_targets_are_the_container_names() -> None:
    assert names.lmcache_targets(1) == ("lmcache",)
    assert names.lmcache_targets(4) == ("lmcache-0", "lmcache-1", "lmcache-2", "lmcache-3")
    assert all(names.is_lmcache(t) for t in (*names.lmcache_targets(4), "lmcache")) and not names.is_lmcache("vllm")


def test_each_servers_series_is_labelled_and_the_bound_is_the_smallest_servers(tmp_path: Path) -> None:
    # Server 2 evicted a chunk the others still hold: it found 6912 of 8064 tokens, so vLLM could load 6912.
    pages: dict[str, str | UpstreamError] = {url: LMCACHE_PAGE for url in SERVER_URLS}
    pages[SERVER_URLS[2]] = with_value(LMCACHE_PAGE, HIT, 6912.0)
    registry, collector = registry_over(tmp_path, pages)
    try:
        value = registry.get_sample_value
        assert [value(HIT, {**LABELS, "lmcache_server": str(i)}) for i in range(4)] == [8064, 8064, 6912, 8064]
        assert value(HIT, LABELS) is None  # no unlabelled duplicate of the four
        assert value("glm53_strict_prefix_bound_tokens_total") == 6912
        assert value("glm53_strict_prefix_bound_achieved_ratio") == 8064 / 6912  # the canned vLLM page's 8064 hits
        for target in ("vllm", *names.lmcache_targets(4)):
            assert value("glm53_upstream_up", {"target": target}) == 1
    finally:
        collector.close()


def test_one_server_down_is_its_own_target_and_leaves_the_bound_unknown(tmp_path: Path) -> None:
    pages: dict[str, str | UpstreamError] = {url: LMCACHE_PAGE for url in SERVER_URLS}
    pages[SERVER_URLS[1]] = UpstreamError(REASON_UNREACHABLE, "connection refused")
    registry, collector = registry_over(tmp_path, pages)
    try:
        value = registry.get_sample_value
        assert value("glm53_upstream_up", {"target": "lmcache-1"}) == 0
        assert value("glm53_upstream_up", {"target": "lmcache-0"}) == 1
        # Every read is a scrape: this is the third, and only lmcache-1 failed each time.
        assert value("glm53_upstream_errors_total", {"target": "lmcache-1", "reason": "unreachable"}) == 3
        assert value("glm53_upstream_errors_total", {"target": "lmcache-0", "reason": "unreachable"}) == 0
        # The connector's minimum cannot be known without every server (and a down one makes every lookup miss).
        assert value("glm53_strict_prefix_bound_tokens_total") is None
        assert value(HIT, {**LABELS, "lmcache_server": "3"}) == 8064  # the others keep their own index
        assert value(HIT, {**LABELS, "lmcache_server": "1"}) is None
    finally:
        collector.close()


def test_the_command_makes_one_target_per_lmcache_url_in_order(tmp_path: Path) -> None:
    from glm53.commands.exporter import build_parser, build_registry

    vllm_log, lmcache_log = copy_logs(tmp_path)
    argv = ["--log", str(vllm_log), "--log", str(lmcache_log), "--profile", "glm53-flash"]
    argv += ["--vllm-url", "http://127.0.0.1:1"]
    for port in (8090, 8091):
        argv += ["--lmcache-url", f"http://127.0.0.1:{port}"]
    _, collector = build_registry(build_parser().parse_args(argv))
    try:
        targets = [(u.target, u.url) for u in collector._upstreams]
    finally:
        collector.close()
    assert targets == [
        ("vllm", "http://127.0.0.1:1/metrics"),
        ("lmcache-0", "http://127.0.0.1:8090/metrics"),
        ("lmcache-1", "http://127.0.0.1:8091/metrics"),
    ]
