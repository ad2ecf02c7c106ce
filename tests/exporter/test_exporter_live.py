"""The exporter against the real CPU-mock pod on loopback: the seed's validation, then one scrape over HTTP.

The seed's protocol: an 8507-token prompt sent cold, vLLM's local prefix cache reset, the prompt sent again, so the
reuse can only come from LMCache: 8064 tokens (floor((8507-1)/1152)*1152) for GLM-5.3-Flash at TP 4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from exporter_fakes import free_port, glm53_child, http_json, scrape_samples

MODEL = "zai-org/GLM-5.3-Flash"


@pytest.mark.slow
def test_exporter_shows_geometry_and_external_hits_of_the_mock_pod(tmp_path: Path) -> None:
    lmcache_port, prometheus_port, http_port = free_port(), free_port(), free_port()
    vllm_port, exporter_port = free_port(), free_port()
    connector = {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": lmcache_port},
    }
    lmcache_args = ["mock", "lmcache", "--port", str(lmcache_port), "--http-port", str(http_port)]
    lmcache_args += ["--prometheus-port", str(prometheus_port), "--chunk-size", "1152", "--separate-object-groups"]
    lmcache_args += ["--l1-size-gb", "1", "--eviction-policy", "LRU"]
    vllm_args = ["mock", "vllm", MODEL, "--profile", "glm53-flash", "--tensor-parallel-size", "4"]
    vllm_args += ["--port", str(vllm_port), "--enable-prefix-caching", "--kv-transfer-config", json.dumps(connector)]
    vllm_args += ["--load-seconds", "0.2"]
    vllm_log, lmcache_log = tmp_path / "vllm.log", tmp_path / "lmcache.log"
    exporter_args = ["exporter", "--log", str(vllm_log), "--log", str(lmcache_log), "--profile", "glm53-flash"]
    exporter_args += ["--vllm-url", f"http://127.0.0.1:{vllm_port}"]
    exporter_args += ["--lmcache-url", f"http://127.0.0.1:{prometheus_port}"]
    exporter_args += ["--host", "127.0.0.1", "--port", str(exporter_port)]

    with glm53_child(lmcache_args, lmcache_log) as lmcache:
        lmcache.wait_for("LMCache MP server listening on")
        with glm53_child(vllm_args, vllm_log, env={"VLLM_SERVER_DEV_MODE": "1"}) as vllm:
            vllm.wait_for("Application startup complete.")
            api = f"http://127.0.0.1:{vllm_port}"
            request = {"model": MODEL, "prompt": list(range(1, 8508)), "max_tokens": 1, "temperature": 0}
            http_json(f"{api}/v1/completions", request)
            assert http_json(f"{api}/reset_prefix_cache", {}) == {"success": True}
            http_json(f"{api}/v1/completions", request)
            with glm53_child(exporter_args, tmp_path / "exporter.out") as exporter:
                exporter.wait_for("serving http://")
                samples = scrape_samples(f"http://127.0.0.1:{exporter_port}/metrics")

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    assert value("glm53_upstream_up", target="vllm") == 1
    assert value("glm53_upstream_up", target="lmcache") == 1
    # Non-zero external hits after the local reset: exactly the seed's 8064 tokens served from LMCache.
    assert value("glm53_prefix_cache_hit_tokens_total", scope="external") == 8064
    assert value("glm53_strict_prefix_bound_tokens_total") == 2 * 8064
    assert value("glm53_strict_prefix_bound_achieved_ratio") == 0.5
    assert value("glm53_effective_chunk_size_tokens") == 1152
    assert value("glm53_scheduler_block_size_tokens") == 1152
    assert value("glm53_attention_block_size_tokens") == 1152
    assert value("glm53_cache_group_tokens_per_block", index="5", kind="kpool_tail_scratch") == 0
    assert value("glm53_geometry_matches_profile") == 1
    assert value("glm53_probe_status", status="ready") == 1
    assert (value("lmcache_mp_l1_memory_usage_bytes") or 0) > 0
