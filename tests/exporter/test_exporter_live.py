"""The exporter as the pod runs it, against the released `lmcache server` on loopback: it scrapes LMCache's `/metrics`
on the server's HTTP port (where `lmcache server` serves it; it opens no --prometheus-port listener) and joins it with
vLLM's counters.

LMCache's traffic is the seed's validation as LMCache's own CPU client sends it (one 8507-token prompt at C = 1152:
a lookup that misses, a store, a lookup that hits 8064 tokens); vLLM's side of the same two requests is a page of its
counters, since vLLM itself does not run on a CPU machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.exporter_fakes import copy_logs, free_port, glm53_child, http_pages, scrape_samples, vllm_page
from tests.support.real_lmcache import http_get, running_lmcache, send_one_request


@pytest.mark.slow
def test_exporter_scrapes_the_real_lmcache_servers_http_port(tmp_path: Path) -> None:
    vllm_log, lmcache_log = copy_logs(tmp_path)
    exporter_port = free_port()
    vllm_metrics = {"/metrics": (200, vllm_page(17014, 0, 17014, 8064))}
    with running_lmcache(tmp_path) as lmcache, http_pages(vllm_metrics) as vllm:
        send_one_request(lmcache)
        args = ["exporter", "--log", str(vllm_log), "--log", str(lmcache_log), "--profile", "glm53-flash"]
        args += ["--chunk-size", "1152", "--vllm-url", vllm, "--lmcache-url", lmcache.http_url]
        args += ["--host", "127.0.0.1", "--port", str(exporter_port)]
        with glm53_child(args, tmp_path / "exporter.out") as exporter:
            exporter.wait_for("serving http://")
            samples = scrape_samples(f"http://127.0.0.1:{exporter_port}/metrics")
        status = json.loads(http_get(f"{lmcache.http_url}/status"))

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, frozenset(labels.items())))

    assert value("glm53_upstream_up", target="lmcache") == 1
    assert value("glm53_upstream_up", target="vllm") == 1
    # LMCache found the seed's 8064 tokens once (the first lookup missed), and vLLM loaded all of them.
    assert value("glm53_strict_prefix_bound_tokens_total") == 8064
    assert value("glm53_strict_prefix_bound_achieved_ratio") == 1.0
    assert value("glm53_prefix_cache_hit_tokens_total", scope="external") == 8064
    # LMCache's own families come through under their real names and labels.
    assert value("lmcache_mp_lookup_requested_tokens_total", cache_salt="", model_name="test-model") == 2 * 8064
    assert value("lmcache_mp_num_finished_stores_total", device="cpu") == 1
    assert (value("lmcache_mp_l1_usage_ratio", backend="dram", l1_tag="_default") or 0) > 0
    assert value("glm53_geometry_matches_profile") == 1
    assert value("glm53_probe_status", status="ready") == 1
    # The server's /status lists registered engines at its top level: none here, for the bench unregisters its client
    # before it exits. (A serving engine's 1 is held by test_real_engine_pod.py through the main job's output.)
    assert status["registered_gpu_ids"] == []
    assert value("glm53_sidecar_registered_engines") == 0
    assert value("glm53_sidecar_link_degraded") == 0
