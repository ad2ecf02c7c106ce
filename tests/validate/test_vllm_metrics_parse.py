"""Parsing vLLM's Prometheus text and turning two scrapes into one request's counter growth."""

from __future__ import annotations

import pytest

from glm53.errors import Glm53Error
from glm53.validate.metrics import EXTERNAL_HITS, LOCAL_HITS, delta, parse_exposition, require

EXPOSITION = """\
# HELP vllm:external_prefix_cache_hits_total External prefix cache hits from KV connector, in terms of tokens.
# TYPE vllm:external_prefix_cache_hits_total counter
vllm:external_prefix_cache_hits_total{engine="0",model_name="zai-org/GLM-5.3-Flash"} 8064.0
vllm:external_prefix_cache_hits_total{engine="1",model_name="zai-org/GLM-5.3-Flash"} 1152.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="zai-org/GLM-5.3-Flash"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="zai-org/GLM-5.3-Flash"} 0.25
"""


def test_samples_are_summed_over_label_sets() -> None:
    snapshot = parse_exposition(EXPOSITION)
    assert snapshot[EXTERNAL_HITS] == 9216.0
    assert snapshot[LOCAL_HITS] == 0.0
    assert snapshot["vllm:kv_cache_usage_perc"] == 0.25


def test_delta_is_the_growth_of_one_counter() -> None:
    before = parse_exposition(EXPOSITION)
    after = parse_exposition(EXPOSITION.replace("} 8064.0", "} 16128.0"))
    assert delta(before, after, EXTERNAL_HITS, "http://x/metrics") == 8064.0


def test_missing_external_counter_names_the_connector_flag() -> None:
    local_only = EXPOSITION[EXPOSITION.index("# HELP vllm:prefix_cache_hits_total") :]
    snapshot = parse_exposition(local_only)
    assert LOCAL_HITS in snapshot
    with pytest.raises(Glm53Error) as caught:
        require(snapshot, EXTERNAL_HITS, "http://127.0.0.1:8000/metrics")
    assert caught.value.exit_code == 2
    assert caught.value.message == (
        "http://127.0.0.1:8000/metrics exposes no vllm:external_prefix_cache_hits_total counter; start vLLM with the "
        'LMCache connector (--kv-transfer-config \'{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both"}\') '
        "and without --disable-log-stats"
    )


def test_missing_local_counter_names_prefix_caching() -> None:
    with pytest.raises(Glm53Error, match="no vllm:prefix_cache_hits_total counter; start vLLM with --enable-prefix"):
        require(parse_exposition(""), LOCAL_HITS, "m")


def test_a_counter_going_down_means_a_restart() -> None:
    before = parse_exposition(EXPOSITION)
    after = parse_exposition(EXPOSITION.replace("} 8064.0", "} 0.0"))
    with pytest.raises(Glm53Error, match="went down between two scrapes of m; the server restarted"):
        delta(before, after, EXTERNAL_HITS, "m")


def test_not_prometheus_text_is_one_line() -> None:
    with pytest.raises(Glm53Error, match="did not answer Prometheus text format"):
        parse_exposition("<html>{not metrics</html>\n")
