"""Prometheus metrics of the mock vLLM server, under vLLM 0.33's names and units (tokens for the cache counters).

Counters are declared without `_total`; prometheus_client appends it on exposition, as vLLM's do:
`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (local cache, tokens),
`vllm:external_prefix_cache_queries_total`, `vllm:external_prefix_cache_hits_total` (connector / LMCache, tokens),
`vllm:prompt_tokens_cached_total`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:request_success_total`; gauges `vllm:kv_cache_usage_perc`, `vllm:num_requests_running`; histograms
`vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`.
Every series carries vLLM's `model_name` and `engine` labels, `vllm:request_success` also `finished_reason`; the
documentation strings and bucket boundaries are vLLM's (tests/mock/test_standin_conformance.py compares them with the
real engine's page).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vllm 0.33.0 v1/metrics/buckets.py:30-51 (REQUEST_LATENCY_BUCKETS) and :57-80 (TIME_TO_FIRST_TOKEN_BUCKETS), as in
# 0.32; the loggers use them unless --custom-histogram-buckets overrides them (loggers.py:831-839).
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
E2E_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
LABELS = ("model_name", "engine")
# vllm 0.33.0 v1/engine/__init__.py:49-72 (FinishReason, as str): vllm:request_success has one series per reason,
# all created up front (loggers.py:807-819); the stand-in's requests end by length, or by error when their KV load
# failed under kv_load_failure_policy=fail.
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
FINISHED_BY_LENGTH = "length"
FINISHED_BY_ERROR = "error"


class VllmMetrics:
    """The families, with vLLM 0.33's documentation strings (v1/metrics/loggers.py, at the line of each name)."""

    def __init__(self, model_name: str, cache_usage: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        values = {"model_name": model_name, "engine": "0"}

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, LABELS, registry=self.registry).labels(**values)

        def gauge(name: str, documentation: str) -> Gauge:
            return Gauge(name, documentation, LABELS, registry=self.registry).labels(**values)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, LABELS, buckets=buckets, registry=self.registry).labels(**values)

        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )  # loggers.py:662
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )  # loggers.py:673
        self.external_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of "
            "queried tokens.",
        )  # loggers.py:686
        self.external_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached "
            "tokens.",
        )  # loggers.py:698
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )  # loggers.py:773
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")  # loggers.py:748
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )  # loggers.py:799
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=self.registry,
        )  # loggers.py:809
        by_reason = {reason: success.labels(**values, finished_reason=reason) for reason in FINISHED_REASONS}
        self.request_success = by_reason[FINISHED_BY_LENGTH]
        self.request_error = by_reason[FINISHED_BY_ERROR]
        usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")  # loggers.py:620
        usage.set_function(cache_usage)
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )  # loggers.py:528
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )  # loggers.py:931
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", E2E_BUCKETS
        )  # loggers.py:961
