"""The upstream metric names the exporter reads, in one place, with where each comes from.

vLLM 0.33 exposes its prefix-cache counters in tokens (`vllm:*_total`). LMCache's multiprocess server exposes
OpenTelemetry instruments through a Prometheus reader, which turns `lmcache_mp.lookup_requested` with unit `tokens`
into `lmcache_mp_lookup_requested_tokens_total` (lmcache 0.5.6: `v1/mp_observability/subscribers/metrics/lookup.py`,
`v1/distributed/l1_manager.py` for the L1 gauges). The dashboard and the alerts use these names too, and a test checks
every name they use against what the exporter, the vLLM mock and the LMCache mock really expose.
"""

from __future__ import annotations

# Targets: the values of the `target` label on the exporter's health metrics.
VLLM = "vllm"
LMCACHE = "lmcache"
TARGETS = (VLLM, LMCACHE)

# vLLM 0.33 prefix-cache counters (tokens). "External" is what the KV connector (LMCache) supplied.
VLLM_LOCAL_QUERIES = "vllm:prefix_cache_queries_total"
VLLM_LOCAL_HITS = "vllm:prefix_cache_hits_total"
VLLM_EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
VLLM_EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"

# LMCache MP server: tokens submitted to lookups, counting only the chunk-aligned part of each lookup, and tokens hit.
LMCACHE_LOOKUP_REQUESTED = "lmcache_mp_lookup_requested_tokens_total"
LMCACHE_LOOKUP_HIT = "lmcache_mp_lookup_hit_tokens_total"

# LMCache families are re-exposed by the exporter unchanged: LMCache's Prometheus port listens on the pod's loopback
# only, so the exporter is the one way Prometheus sees them.
LMCACHE_PASSTHROUGH_PREFIXES = ("lmcache_", "lmcache:")
