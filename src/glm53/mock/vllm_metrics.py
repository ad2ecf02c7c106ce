"""Prometheus metrics of the mock vLLM server, under vLLM 0.33's names and units (tokens for the cache counters).

Counters are declared without `_total`; prometheus_client appends it on exposition, as vLLM's do:
`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (local cache, tokens),
`vllm:external_prefix_cache_queries_total`, `vllm:external_prefix_cache_hits_total` (connector / LMCache, tokens),
`vllm:prompt_tokens_cached_total`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:request_success_total`; gauges `vllm:kv_cache_usage_perc`, `vllm:num_requests_running`; histograms
`vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`.
Every series carries vLLM's `model_name` and `engine` labels.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's own bucket boundaries for the latency histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
LABELS = ("model_name", "engine")


class VllmMetrics:
    def __init__(self, model_name: str, cache_usage: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        values = {"model_name": model_name, "engine": "0"}

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, LABELS, registry=self.registry).labels(**values)

        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens")
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries", "External prefix cache (KV connector) queries, in tokens"
        )
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits", "External prefix cache (KV connector) hits, in tokens"
        )
        self.prompt_tokens_cached = counter("vllm:prompt_tokens_cached", "Prompt tokens served from any cache")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed")
        self.request_success = counter("vllm:request_success", "Count of successfully processed requests")
        usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent", LABELS, registry=self.registry)
        usage.labels(**values).set_function(cache_usage)
        running = Gauge("vllm:num_requests_running", "Requests in the engine", LABELS, registry=self.registry)
        self.running = running.labels(**values)
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        ).labels(**values)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency",
            LABELS,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        ).labels(**values)
