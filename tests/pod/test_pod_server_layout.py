"""The chart's perRank server layout run on loopback: GLM-5.3-Flash's stand-in at TP 4 next to 4 real LMCache servers.

The rendered pod (lmcache.serverLayout=perRank) starts `lmcache-0` ... `lmcache-3` one after another, each behind its
own startup probe, then the engine stand-in, whose connector adapters are LMCache's own
(`LMCacheMPSchedulerAdapter` with every server's URL, one `LMCacheMPWorkerAdapter` per rank on its own server:
lmcache 0.5.6 lmcache/integration/vllm/lmcache_mp_connector.py:727-771). One prompt is stored by all four ranks and
hits again from all four servers: the scheduler's lookup asks every server and takes the minimum
(lmcache/integration/vllm/vllm_multi_process_adapter.py:1054-1068), so 8064 of the seed's 8507 tokens come back only
because every server holds its rank's chunks. Then one server alone loses the prompt (LMCache's own CLEAR, sent by
its own request client, stands in for an eviction there) while the other three still hold their shards: the next
request hits nothing, since the minimum over the servers is 0, and the connector logs the mismatch (:1057-1066) and
frees the other servers' tail locks (:919-955). Four real servers are about 6 GB of memory here.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from glm53.exporter.upstream import parse_exposition
from glm53.pod.main_job import PodAddresses, PodOptions, render_plans, started_pod
from glm53.profiles import get_profile
from glm53.validate.client import VllmClient
from glm53.validate.prompts import token_id_prompt

pytestmark = pytest.mark.slow

FLASH = get_profile("glm53-flash")
# Without the L2 tier: the CLEAR below stands in for one server's eviction, and with the chart's default fs tier the
# server would prefetch its shard back from the pod's directory (tests/pod/test_l2_tier.py covers the tier).
PER_RANK = {"lmcache": {"serverLayout": "perRank", "l2": {"type": "off"}}}
SERVERS = ("lmcache-0", "lmcache-1", "lmcache-2", "lmcache-3")
# The seed's 8507-token prompt at C = 1152, strict prefix (hybrid): floor(8506 / 1152) * 1152.
PROMPT_TOKENS, HIT_TOKENS = 8507, 8064


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_the_per_rank_pod_is_ready_and_a_prompt_hits_from_all_four_servers(tmp_path: Path) -> None:
    plans = render_plans(PodOptions(FLASH, values=PER_RANK))
    assert [c.name for c in plans.serving.lmcache_servers()] == list(SERVERS)
    lines: list[str] = []
    with started_pod(plans, tmp_path, lines.append) as pod:
        urls = PodAddresses.of(pod.plan)
        assert len(set(urls.lmcache_servers)) == 4
        assert all(f"pod: LMCache 0.5.6 server {name} healthy" in "\n".join(lines) for name in SERVERS), lines
        client = VllmClient(urls.vllm, 60.0)
        prompt = token_id_prompt(PROMPT_TOKENS, seed=26, id_range=FLASH.prompt_token_ids)
        model = client.model_ids()[0]
        first = client.complete(model, prompt, max_tokens=1, cache_salt="per-rank")
        client.reset_prefix_cache()  # vLLM's own cache only: the second request must come from LMCache
        second = client.complete(model, prompt, max_tokens=1, cache_salt="per-rank")
        pages = {name: _get(f"{url}/metrics") for name, url in zip(SERVERS, urls.lmcache_servers, strict=True)}
        assert urls.exporter is not None
        exported = parse_exposition(_get(urls.exporter))
        evicted = evict_everything_on(pod.plan.lmcache_servers()[3].option("--port"))
        client.reset_prefix_cache()
        third = client.complete(model, prompt, max_tokens=1, cache_salt="per-rank")
        after = {name: _get(f"{url}/metrics") for name, url in zip(SERVERS, urls.lmcache_servers, strict=True)}
    engine_log = (tmp_path / "logs" / "vllm.log").read_text(errors="replace")

    assert first.cached_tokens == 0
    assert second.cached_tokens == HIT_TOKENS
    for name, page in pages.items():
        # Every server stored its rank's shard and found the whole strict prefix for the second lookup.
        hits = parse_exposition(page).total("lmcache_mp_lookup_hit_tokens_total")
        stores = parse_exposition(page).total("lmcache_mp_num_finished_stores_total")
        assert hits == HIT_TOKENS, (name, hits)
        assert stores is not None and stores >= 1, (name, stores)
    up = {s.labels["target"]: s.value for f in exported.families if f.name == "glm53_upstream_up" for s in f.samples}
    assert up == {"vllm": 1.0, **{name: 1.0 for name in SERVERS}}
    servers = {
        s.labels.get("lmcache_server")
        for f in exported.families
        if f.name.startswith("lmcache_mp_lookup_hit")
        for s in f.samples
    }
    assert servers == {"0", "1", "2", "3"}
    assert exported.total("glm53_strict_prefix_bound_tokens_total") == HIT_TOKENS
    assert exported.total("glm53_sidecar_registered_engines") == 1  # each server registered its one rank

    assert evicted
    assert third.cached_tokens == 0
    for name in SERVERS[:3]:  # they still held the prompt and said so; server 3 found nothing
        assert parse_exposition(after[name]).total("lmcache_mp_lookup_hit_tokens_total") == 2 * HIT_TOKENS, name
    assert parse_exposition(after[SERVERS[3]]).total("lmcache_mp_lookup_hit_tokens_total") == HIT_TOKENS
    assert "LMCache hit mismatch across servers" in engine_log and "take min=0" in engine_log


def evict_everything_on(zmq_port: str) -> bool:
    """CLEAR (not forced) on one server, through LMCache's own request client, as the connector's reset_cache sends
    it to every server (vllm_multi_process_adapter.py:1093-1129); True when the server answered."""
    import zmq
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

    context = zmq.Context()
    client = RequestClientFactory.create(f"tcp://127.0.0.1:{zmq_port}", context=context)
    try:
        client.clear(force=False).result(timeout=30)
        return True
    finally:
        client.close()
        context.term()
