"""Read vLLM's Prometheus counters and turn two scrapes into what one request did.

vLLM 0.33 counts prefix-cache traffic in tokens: `vllm:external_prefix_cache_hits_total` is what the KV connector
(LMCache) served, `vllm:prefix_cache_hits_total` what vLLM's own prefix cache served. Requests run one at a time during
validation, so the difference of a counter across one request is that request's share. A counter that is missing means
the server was started without the feature that produces it; the error names the flag to add.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from prometheus_client.parser import text_string_to_metric_families

from glm53.errors import EXIT_USAGE, Glm53Error

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
EXTERNAL_QUERIES = "vllm:external_prefix_cache_queries_total"
LOCAL_HITS = "vllm:prefix_cache_hits_total"
LOCAL_QUERIES = "vllm:prefix_cache_queries_total"

_CONNECTOR_HINT = (
    'start vLLM with the LMCache connector (--kv-transfer-config \'{"kv_connector":"LMCacheMPConnector",'
    '"kv_role":"kv_both"}\') and without --disable-log-stats'
)
_PREFIX_CACHING_HINT = "start vLLM with --enable-prefix-caching and without --disable-log-stats"

# What to enable when a counter is absent.
ENABLE_HINTS: Mapping[str, str] = MappingProxyType(
    {
        EXTERNAL_HITS: _CONNECTOR_HINT,
        EXTERNAL_QUERIES: _CONNECTOR_HINT,
        LOCAL_HITS: _PREFIX_CACHING_HINT,
        LOCAL_QUERIES: _PREFIX_CACHING_HINT,
    }
)

Snapshot = Mapping[str, float]


def parse_exposition(text: str) -> Snapshot:
    """Every sample in a Prometheus text exposition, summed over label sets (engines, model names) by sample name."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError as error:
        raise Glm53Error(
            f"the metrics endpoint did not answer Prometheus text format ({error}); point --base-url at vLLM itself"
        ) from None
    return MappingProxyType(totals)


def require(snapshot: Snapshot, name: str, source: str) -> float:
    """The value of `name`, or a one-line error saying which flag makes the server expose it."""
    try:
        return snapshot[name]
    except KeyError:
        hint = ENABLE_HINTS.get(name, "check that --base-url points at vLLM 0.33 or newer")
        raise Glm53Error(f"{source} exposes no {name} counter; {hint}", EXIT_USAGE) from None


def delta(before: Snapshot, after: Snapshot, name: str, source: str) -> float:
    """How much counter `name` grew between two scrapes (a counter that went down means the server restarted)."""
    grown = require(after, name, source) - require(before, name, source)
    if grown < 0:
        raise Glm53Error(f"{name} went down between two scrapes of {source}; the server restarted, validate again")
    return grown
