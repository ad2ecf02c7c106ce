"""Prometheus metrics of the mock LMCache server, under the names the real 0.5.6 MP server exposes.

The real server records OpenTelemetry instruments and serves them through the OTel Prometheus exporter, which turns
`lmcache_mp.lookup_hit` (unit `tokens`) into `lmcache_mp_lookup_hit_tokens_total`. Mirrored here (0.5.6 wheel,
`lmcache/v1/mp_observability/subscribers/metrics/lookup.py` and `l1.py`, `lmcache/v1/distributed/l1_manager.py`):

- `lmcache_mp_lookup_requested_tokens_total` - chunk-aligned tokens submitted for lookup
- `lmcache_mp_lookup_hit_tokens_total` - tokens of the contiguous prefix hit
- `lmcache_mp_lookup_hit_l1_tokens_total` - of those, served by L1 (all of them: the mock has no L2)
- `lmcache_mp_l1_write_chunks_total` - chunks written to L1 (what was stored)
- `lmcache_mp_l1_read_chunks_total` - chunks read from L1 by lookups that hit
- `lmcache_mp_l1_evicted_chunks_total` - chunks evicted from L1
- `lmcache_mp_l1_memory_usage_bytes` - bytes held in L1 (gauge)
- `lmcache_mp_l1_usage_ratio` - used / capacity, 0.0-1.0 (gauge; capacity = usage_bytes / ratio)

The real counters carry `model_name` and `cache_salt` attributes; the mock leaves them unlabelled, because a unique
salt per cold request would only multiply series. The real server has no stored-*tokens* counter: stored tokens are
`l1_write_chunks` times the chunk size.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from glm53.mock.store import ChunkStore


class LMCacheMetrics:
    """The instruments, registered in their own registry (never prometheus_client's global one)."""

    def __init__(self, store: ChunkStore) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.lookup_requested = Counter(
            "lmcache_mp_lookup_requested_tokens", "Chunk-aligned tokens submitted for lookup", registry=r
        )
        self.lookup_hit = Counter("lmcache_mp_lookup_hit_tokens", "Tokens of the contiguous prefix hit", registry=r)
        self.lookup_hit_l1 = Counter("lmcache_mp_lookup_hit_l1_tokens", "Of lookup_hit, tokens L1 served", registry=r)
        self.l1_write = Counter("lmcache_mp_l1_write_chunks", "Chunks written to L1", registry=r)
        self.l1_read = Counter("lmcache_mp_l1_read_chunks", "Chunks read from L1", registry=r)
        self.l1_evicted = Counter("lmcache_mp_l1_evicted_chunks", "Chunks evicted from L1", registry=r)
        usage = Gauge("lmcache_mp_l1_memory_usage_bytes", "Bytes currently held in L1 cache", registry=r)
        usage.set_function(lambda: store.used_bytes)
        ratio = Gauge("lmcache_mp_l1_usage_ratio", "L1 used/total ratio (0.0-1.0)", registry=r)
        ratio.set_function(lambda: store.used_bytes / store.capacity_bytes if store.capacity_bytes else 0.0)

    def record_lookup(self, requested_tokens: int, hit_tokens: int, hit_chunks: int) -> None:
        self.lookup_requested.inc(requested_tokens)
        self.lookup_hit.inc(hit_tokens)
        self.lookup_hit_l1.inc(hit_tokens)
        self.l1_read.inc(hit_chunks)

    def record_store(self, written: int, evicted: int) -> None:
        self.l1_write.inc(written)
        self.l1_evicted.inc(evicted)
