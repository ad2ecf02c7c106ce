"""The exporter's custom collector: every scrape joins fresh log facts with fresh vLLM and LMCache metrics.

Follows prometheus_client's custom-collector pattern: `collect()` builds new `*MetricFamily` objects on each call and
keeps no metric objects between scrapes, and the collector is registered on a `CollectorRegistry` the caller injects
(never the process-global one), so tests read values back with `registry.get_sample_value(...)`.
The only state kept across scrapes is what must be: the log followers' positions (so a scrape reads only the bytes
appended since the last one), the error and restart counters, and the previous upstream snapshots that restart
detection compares against.

Joined metrics (all derived from counters, so they are cumulative over the upstream processes' lifetimes; the
dashboard and alerts take `rate()`s of the `_total` series for windows):

- `glm53_prefix_cache_hit_ratio{scope}`: vLLM's hits / queries, in tokens; `scope="local"` is vLLM's own prefix cache,
  `scope="external"` what the KV connector (LMCache) supplied. `glm53_prefix_cache_hit_tokens_total{scope="external"}`
  is therefore the number of prompt tokens served from LMCache.
- `glm53_strict_prefix_bound_tokens_total`: the tokens LMCache found for the connector's lookups
  (`lmcache_mp_lookup_hit_tokens_total`): the run of whole chunks it held within each lookup's range, and that range
  is the prompt less its last token for hybrid models (the strict prefix: lmcache 0.5.6
  lmcache/integration/vllm/lmcache_mp_connector.py:601 and :1300, vllm_multi_process_adapter.py:891) and the whole
  prompt otherwise. It is the most vLLM could load from LMCache.
- `glm53_strict_prefix_bound_achieved_ratio`: the tokens vLLM loaded from LMCache (its external hits) / that bound.
  A prompt LMCache never held (a new prompt, or validation's deliberately cold runs with a unique `cache_salt`) adds
  nothing to either side, so traffic no cache could have served does not drag it down; misses show in LMCache's own
  hit rate (`lmcache_mp_lookup_hit_tokens_total` / `lmcache_mp_lookup_requested_tokens_total`). Near 1 means LMCache
  delivers all it can. Single-group models sit just below 1: on a full-prompt hit the connector loads one token fewer
  (lmcache_mp_connector.py:1341-1346). Clearly below 1 means held chunks did not reach vLLM: its own prefix cache
  already had them (the connector then loads only the rest) or the loads failed and were recomputed
  (lmcache_mp_connector.py:1266-1292).

Across LMCache generations the bound keeps its meaning, "what vLLM could still load from LMCache", and gets tighter:
0.5.6 looks up from token 0 (lmcache_mp_connector.py:1295-1301, the adapter's `start=0`,
vllm_multi_process_adapter.py:892-899), so its hit counter also counts chunks vLLM's own prefix cache holds, while
0.5.7rc2 starts the lookup at vLLM's local hit, floored to a chunk (lmcache 0.5.7rc2 lmcache_mp_connector.py:1360-1384),
so its counter is the external part alone, to within one chunk. 0.5.7rc2 adds `lmcache_mp_lookup_prompt_tokens_total`
(the prompt as sent) and `lmcache_mp_lookup_request_hit_tokens_total` (the longer of vLLM's local hit and LMCache's,
v1/multiprocess/modules/lookup.py:735), which mix both caches; they pass through, and vLLM's own local and external
counters stay the source of the hit ratios in either generation.

LMCache's own `lmcache_*` families are re-exposed unchanged: `lmcache server` serves them on its HTTP port, which
listens on the pod's loopback only, so the exporter is how Prometheus (and the dashboard's L1 memory panel) sees them.
With one server per TP rank (targets `lmcache-<i>`) each server's samples gain the label `lmcache_server="<i>"`, so the
servers' series stay apart, and the strict-prefix bound is the smallest of the servers' hit counters: the connector
asks every server and takes the minimum (lmcache 0.5.6 vllm_multi_process_adapter.py:1054-1068), so no more than the
server holding the least can reach vLLM.

The L2 tier (`lmcache server --l2-adapter`) needs nothing joined: its families pass through like the rest
(`lmcache_mp_l2_*` and `lmcache_mp_num_inflight_l2_stores`, lmcache 0.5.6
lmcache/v1/mp_observability/subscribers/metrics/l2.py, l2_failures.py, store_controller.py:406-431), and what an
operator asks of them (are stores and loads succeeding, is a store hung) is a ratio or a presence test over one
server's own counters, which the alert and the dashboard write in PromQL. Two traps are in the counters' meaning,
not their shape: a failed store still counts in `lmcache_mp_l2_store_completed_requests_total`, only
`..._completed_objects_chunks_total` counts stored chunks (store_controller.py:755-795); and every `*_chunks_total`
but the prefetch failures is labelled by `cache_salt` (lmcache/v1/mp_observability/subscribers/metrics/utils.py:20-34,
l2.py:133-170), so per-request or per-tenant salts give each salt a series born at its final value, which rate()
never counts. Hence `glm53_lmcache_l2_store_failures_total{lmcache_server}`: the failed store tasks each server logged
(one `Store task <id> to adapter <n> failed for keys: ...` warning per task, store_controller.py:791-796), unsalted,
exposed at 0 from the first scrape so the first failure is a rate; set against
`lmcache_mp_l2_store_submitted_requests_total` (one store task per submitted request and adapter) it is the share of
stores that fail. Like the link events it counts since the exporter began reading: a restarted exporter reads the
logs again and Prometheus sees a counter reset.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from glm53.exporter import names
from glm53.exporter.facts import VERDICT_STATUSES, LogFacts
from glm53.exporter.names import LMCACHE_SERVER_LABEL, is_lmcache
from glm53.exporter.upstream import (
    REASON_HTTP_STATUS,
    REASON_MALFORMED,
    REASON_UNREACHABLE,
    Snapshot,
    UpstreamError,
    restarted,
)

ERROR_REASONS = (REASON_UNREACHABLE, REASON_HTTP_STATUS, REASON_MALFORMED)


class LogSource(Protocol):
    """The log side: reads what was appended since the last call and returns the accumulated start-up facts."""

    def poll(self) -> LogFacts: ...


Scraper = Callable[[str], Snapshot]


@dataclass(frozen=True)
class Upstream:
    """One endpoint to scrape: `target` is the label value (`vllm`, `lmcache`), `url` its metrics URL."""

    target: str
    url: str


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _gauge(name: str, documentation: str, value: float | None) -> list[Metric]:
    """A one-sample gauge family, or nothing when the value is not known yet (absent beats a made-up 0)."""
    return [] if value is None else [GaugeMetricFamily(name, documentation, value=value)]


def log_families(facts: LogFacts) -> list[Metric]:
    """The start-up facts parsed from the logs, as metric families."""
    families: list[Metric] = []
    families += _gauge(
        "glm53_configured_chunk_size_tokens",
        "LMCache chunk size the deployment configured (--chunk-size, or the configured_min the server logged; without "
        "either, the size the server logged it started with).",
        facts.configured_chunk_size,
    )
    families += _gauge(
        "glm53_effective_chunk_size_tokens",
        "LMCache chunk size in force: the negotiated size when the server logged one, else the size the server logged "
        "it started with, else the configured size.",
        facts.effective_chunk_size,
    )
    families += _gauge(
        "glm53_server_chunk_size_tokens",
        "LMCache chunk size the server logged at start ('TokenHasher initialized: chunk_size=C'); absent until it "
        "does. The verdict is wrong when --chunk-size says otherwise.",
        facts.server_chunk_size,
    )
    families += _gauge(
        "glm53_required_alignment_tokens",
        "Every chunk size must be a multiple of this (LCM of the positive group block sizes).",
        facts.required_alignment,
    )
    families += _gauge(
        "glm53_attention_block_size_tokens",
        "vLLM's unified attention block size N (hybrid models log it at start-up).",
        facts.attention_block_size,
    )
    geometry = facts.geometry
    if geometry is not None:
        families += _gauge(
            "glm53_scheduler_block_size_tokens",
            "scheduler_block_size from the connector's resolved geometry.",
            geometry.scheduler_block_size,
        )
        groups = GaugeMetricFamily(
            "glm53_cache_group_tokens_per_block",
            "tokens_per_block of each KV-cache group the connector resolved (0: scratch group, never cached).",
            labels=["index", "kind"],
        )
        for index, (tokens, kind) in enumerate(zip(geometry.groups, facts.group_kinds, strict=True)):
            groups.add_metric([str(index), kind], tokens)
        families.append(groups)
        info = InfoMetricFamily("glm53_geometry", "The connector's resolved geometry line and the profile it is for.")
        info.add_metric(
            [],
            {
                "profile": facts.profile.name,
                "group_tokens_per_block": ",".join(str(g) for g in geometry.groups),
                "cache_model_name": geometry.cache_model_name or "",
            },
        )
        families.append(info)
    families += _gauge(
        "glm53_geometry_matches_profile",
        "1 when the resolved groups are the ones the profile expects for this N and TP size, else 0.",
        None if facts.geometry_matches is None else float(facts.geometry_matches),
    )
    families += _gauge(
        "glm53_geometry_resolved_after_start_seconds",
        "Seconds from the vLLM process's first log line to its geometry line (from the log timestamps).",
        facts.geometry_after_start_seconds,
    )
    status = GaugeMetricFamily(
        "glm53_probe_status",
        "The startup probe's verdict on the logs: 1 for the current status (ready, not_yet or wrong), else 0.",
        labels=["status"],
    )
    for name in VERDICT_STATUSES:
        status.add_metric([name], 1.0 if name == facts.verdict_status else 0.0)
    families.append(status)
    read = CounterMetricFamily(
        "glm53_log_read_bytes",
        "Log bytes the exporter has read (each byte once; rotation restarts a file).",
        labels=["log"],
    )
    for path, count in facts.bytes_read:
        read.add_metric([path], count)
    families.append(read)
    families += link_families(facts)
    families += l2_families(facts.l2_store_failures)
    return families


def link_families(facts: LogFacts) -> list[Metric]:
    """After Ready: the engine's link to its sidecar, from the connector's and the server's own log lines."""
    events = CounterMetricFamily(
        "glm53_sidecar_link_events",
        "Connector and server lines about the engine-sidecar link: degraded (a heartbeat ping failed), recovered, "
        "reregistered (KV caches registered again with a returned server), store_rejected / retrieve_rejected (the "
        "server does not know the engine: caching is dead until it registers, LMCache #4642), load_failed (requests "
        "ended by a failed KV load).",
        labels=["event"],
    )
    for event, count in facts.link_events:
        events.add_metric([event], count)
    degraded = GaugeMetricFamily(
        "glm53_sidecar_link_degraded",
        "1 while a connector adapter of the running engine last logged 'LMCache server is unhealthy' (degraded mode: "
        "lookups miss, stores are dropped), else 0.",
        value=1.0 if facts.link_degraded else 0.0,
    )
    return [events, degraded]


def l2_families(store_failures: Iterable[tuple[str, int]]) -> list[Metric]:
    """The failed L2 store tasks each LMCache server logged (`LogFacts.l2_store_failures`), labelled as its
    pass-through series are: the pod's one server's carry no `lmcache_server`, per-rank servers' carry their index."""
    name = "glm53_lmcache_l2_store_failures"
    family = Metric(
        name,
        "L2 store tasks the LMCache server logged as failed ('Store task N to adapter A failed for keys'), since the "
        "exporter began reading its log; unlike LMCache's chunk counters, not split by cache_salt.",
        "counter",
    )
    for server, count in store_failures:
        family.add_sample(name + "_total", {LMCACHE_SERVER_LABEL: server} if server else {}, count)
    return [family] if family.samples else []


def _scoped_counter(name: str, documentation: str, local: float | None, external: float | None) -> list[Metric]:
    family = CounterMetricFamily(name, documentation, labels=["scope"])
    for scope, value in (("local", local), ("external", external)):
        if value is not None:
            family.add_metric([scope], value)
    return [family] if family.samples else []


def lookup_bound(servers: Sequence[Snapshot | None]) -> float | None:
    """The tokens LMCache found for vLLM's lookups: the one server's hit counter, or with one server per rank the
    smallest (the connector's minimum over servers); unknown unless every server answered and exposes it."""
    totals = [server.total(names.LMCACHE_LOOKUP_HIT) if server else None for server in servers]
    if not totals or any(total is None for total in totals):
        return None
    return min(total for total in totals if total is not None)


def passthrough_families(servers: Sequence[Snapshot | None]) -> list[Metric]:
    """LMCache's own families as the servers exposed them (None: a server that did not answer this scrape). With
    several servers each sample is labelled with its server's index (`lmcache_server`), one family per name, so no
    two servers' samples collide; the pod's one server's pass through as they are."""
    answered = [server for server in servers if server is not None]
    if len(servers) == 1:
        return answered[0].families_with_prefix(names.LMCACHE_PASSTHROUGH_PREFIXES) if answered else []
    merged: dict[str, Metric] = {}
    for index, server in enumerate(servers):
        for family in server.families_with_prefix(names.LMCACHE_PASSTHROUGH_PREFIXES) if server else []:
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type, family.unit))
            for sample in family.samples:
                labels = {**sample.labels, LMCACHE_SERVER_LABEL: str(index)}
                into.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
    return list(merged.values())


def cache_families(vllm: Snapshot | None, lmcache: Snapshot | Sequence[Snapshot | None] | None) -> list[Metric]:
    """Cache effectiveness joined from vLLM's and LMCache's counters (see the module docstring for definitions);
    `lmcache` is the pod's server or the list of its per-rank servers."""
    local_q = vllm.total(names.VLLM_LOCAL_QUERIES) if vllm else None
    local_h = vllm.total(names.VLLM_LOCAL_HITS) if vllm else None
    external_q = vllm.total(names.VLLM_EXTERNAL_QUERIES) if vllm else None
    external_h = vllm.total(names.VLLM_EXTERNAL_HITS) if vllm else None
    bound = lookup_bound(lmcache if isinstance(lmcache, Sequence) else [lmcache])
    families: list[Metric] = []
    families += _scoped_counter(
        "glm53_prefix_cache_queried_tokens",
        "Prompt tokens looked up in vLLM's local prefix cache (local) or through the KV connector (external).",
        local_q,
        external_q,
    )
    families += _scoped_counter(
        "glm53_prefix_cache_hit_tokens",
        "Prompt tokens found; scope=external counts the tokens served from LMCache.",
        local_h,
        external_h,
    )
    ratios = GaugeMetricFamily(
        "glm53_prefix_cache_hit_ratio", "Hit tokens / queried tokens since the vLLM process started.", labels=["scope"]
    )
    for scope, value in (("local", _ratio(local_h, local_q)), ("external", _ratio(external_h, external_q))):
        if value is not None:
            ratios.add_metric([scope], value)
    if ratios.samples:
        families.append(ratios)
    if bound is not None:
        families.append(
            CounterMetricFamily(
                "glm53_strict_prefix_bound_tokens",
                "Tokens LMCache found for vLLM's lookups (whole chunks of the strict prefix): the most vLLM can load.",
                value=bound,
            )
        )
    families += _gauge(
        "glm53_strict_prefix_bound_achieved_ratio",
        "Tokens vLLM loaded from LMCache / glm53_strict_prefix_bound_tokens_total; prompts LMCache never held count "
        "on neither side.",
        _ratio(external_h, bound),
    )
    return families


class Glm53Collector(Collector):
    """Joins log facts with upstream metrics at every scrape; register it on an injected `CollectorRegistry`."""

    def __init__(
        self,
        logs: LogSource,
        upstreams: Sequence[Upstream],
        scraper: Scraper,
        registration: Callable[[], int] | None = None,
    ) -> None:
        """`registration` counts the engines the sidecar has registered (its /status); None: not measured."""
        self._logs = logs
        self._upstreams = tuple(upstreams)
        self._scraper = scraper
        self._registration = registration
        # Prometheus (and an operator's curl) may scrape concurrently; the followers and counters are not re-entrant.
        self._lock = threading.Lock()
        workers = len(self._upstreams) + (1 if registration else 0)
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="glm53-scrape")
        self._errors = {(u.target, reason): 0 for u in self._upstreams for reason in ERROR_REASONS}
        self._restarts = {u.target: 0 for u in self._upstreams}
        self._previous: dict[str, Snapshot] = {}

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            return self._collect_locked()

    def _registered(self) -> float | None:
        assert self._registration is not None
        try:
            return float(self._registration())
        except UpstreamError:
            return None

    def _scrape_one(self, upstream: Upstream) -> Snapshot | UpstreamError:
        try:
            return self._scraper(upstream.url)
        except UpstreamError as error:
            return error

    def _account(self, results: Mapping[str, Snapshot | UpstreamError]) -> dict[str, Snapshot]:
        """Update error and restart counters; return the snapshots of the upstreams that answered."""
        good: dict[str, Snapshot] = {}
        for target, result in results.items():
            if isinstance(result, UpstreamError):
                self._errors[(target, result.reason)] += 1
                continue
            previous = self._previous.get(target)
            if previous is not None and restarted(previous, result):
                self._restarts[target] += 1
            self._previous[target] = result
            good[target] = result
        return good

    def _collect_locked(self) -> list[Metric]:
        started = time.perf_counter()
        # Both upstreams are scraped at once (a slow one costs its timeout once) while this thread reads the logs.
        pending = {u.target: self._pool.submit(self._scrape_one, u) for u in self._upstreams}
        registered = self._pool.submit(self._registered) if self._registration else None
        facts = self._logs.poll()
        snapshots = self._account({target: future.result() for target, future in pending.items()})
        families = log_families(facts)
        servers = [snapshots.get(u.target) for u in self._upstreams if is_lmcache(u.target)]
        families += cache_families(snapshots.get(names.VLLM), servers)
        families += passthrough_families(servers)
        families += self._health_families(snapshots)
        if registered is not None:
            families += _gauge(
                "glm53_sidecar_registered_engines",
                "Engine instances the LMCache sidecar has registered (GET /status, registered_gpu_ids); 0 while vLLM "
                "runs means every store and retrieve is rejected. Absent when the sidecar does not answer.",
                registered.result(),
            )
        families.append(
            GaugeMetricFamily(
                "glm53_scrape_duration_seconds",
                "Time this scrape took: both upstream scrapes plus reading the new log bytes.",
                value=time.perf_counter() - started,
            )
        )
        return families

    def _health_families(self, snapshots: Mapping[str, Snapshot]) -> list[Metric]:
        up = GaugeMetricFamily(
            "glm53_upstream_up", "1 when the upstream's metrics were scraped and parsed.", labels=["target"]
        )
        errors = CounterMetricFamily(
            "glm53_upstream_errors",
            "Failed upstream scrapes by target and reason (unreachable, http_status, malformed).",
            labels=["target", "reason"],
        )
        restarts = CounterMetricFamily(
            "glm53_upstream_restarts",
            "Upstream restarts seen between two scrapes (process start time changed or counters reset).",
            labels=["target"],
        )
        for upstream in self._upstreams:
            up.add_metric([upstream.target], 1.0 if upstream.target in snapshots else 0.0)
            restarts.add_metric([upstream.target], self._restarts[upstream.target])
        for (target, reason), count in self._errors.items():
            errors.add_metric([target, reason], count)
        return [up, errors, restarts]
