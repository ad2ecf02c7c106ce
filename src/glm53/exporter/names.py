"""The upstream metric names the exporter reads, in one place, with where each comes from.

vLLM 0.33 exposes its prefix-cache counters in tokens (`vllm:*_total`, vllm/v1/metrics/loggers.py:661-706).
`lmcache server` exposes OpenTelemetry instruments through a Prometheus reader on its HTTP port's `/metrics`, which
turns `lmcache_mp.lookup_hit` with unit `tokens` into `lmcache_mp_lookup_hit_tokens_total` (lmcache 0.5.6
lmcache/v1/mp_observability/subscribers/metrics/lookup.py:82-99). The dashboard and the alerts use these names too,
and a test checks every name they use against a page captured from the real server and vLLM's names.
"""

from __future__ import annotations

# Targets: the values of the `target` label on the exporter's health metrics.
VLLM = "vllm"
LMCACHE = "lmcache"
TARGETS = (VLLM, LMCACHE)
# With one LMCache server per TP rank (the chart's lmcache.serverLayout=perRank) each server is its own target, named
# as its container: `lmcache-<i>`; its re-exposed families carry this label with the server's index.
LMCACHE_SERVER_LABEL = "lmcache_server"


def lmcache_targets(count: int) -> tuple[str, ...]:
    """The target names of `count` LMCache servers: `lmcache` for the pod's one, else `lmcache-0` ... (the container
    names)."""
    return (LMCACHE,) if count == 1 else tuple(f"{LMCACHE}-{index}" for index in range(count))


def is_lmcache(target: str) -> bool:
    return target == LMCACHE or target.startswith(LMCACHE + "-")


# vLLM 0.33 prefix-cache counters (tokens). "External" is what the KV connector (LMCache) supplied.
VLLM_LOCAL_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_LOCAL_HITS = "vllm:prefix_cache_hits_total"
VLLM_EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
VLLM_EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"

# LMCache MP server: tokens found by lookups (the contiguous run of whole chunks held), the bound vLLM can load.
LMCACHE_LOOKUP_HIT = "lmcache_mp_lookup_hit_tokens_total"

# LMCache families are re-exposed by the exporter unchanged: `lmcache server`'s HTTP port listens on the pod's
# loopback only, so the exporter is the one way Prometheus sees them.
LMCACHE_PASSTHROUGH_PREFIXES = ("lmcache_", "lmcache:")
