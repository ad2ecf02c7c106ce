"""Every alert the chart ships, run by the real promtool (`promtool test rules`): each fires on its fault, with the
exact labels and annotations an operator receives, and stays silent on a healthy pod.

The rules are read from the PrometheusRule the chart renders with `ci/monitoring-values.yaml` (`glm53.pod.chart.render`,
Helm's engine in-process), not from `files/glm53-alerts.yaml`: the chart rewrites every `runbook_url` under
`monitoring.prometheusRule.runbookBaseUrl`, and the rendered object is what the Prometheus Operator loads.

The healthy pod is the pair of `/metrics` pages captured from the real CPU pod (`fixtures/healthy-pod-*.prom`, made by
`real_pod.py`), each sample held constant, labelled as Prometheus labels what it scrapes through the chart's
ServiceMonitor, plus the one series Prometheus itself writes for each target it scrapes that an alert reads: `up`,
from the target's labels, 1 while the target answers. A fault changes series of that pod the way the exporter and
Prometheus report it (a gauge flips, a counter grows, the exporter's series go stale and its target's `up` turns 0),
never invents a series, so every name a case uses is one the real pod serves or Prometheus writes for its targets; a
rollout's new pod serves the same pages under its own pod name and address. Timing is the chart's: samples at the
ServiceMonitor's interval, rules evaluated at the Prometheus Operator's default interval.

A pod with a given L2 tier, or with none, is the captured pod whose exporter page carries, in place of its own, the L2
tier's families of a page the real `lmcache server` served with that tier or without one (`fixtures/lmcache-l2-*.prom`,
made by `real_l2.py`), as the exporter's pass-through re-exposes them (`glm53.exporter.collector.passthrough_families`),
with the exporter's count of the server's failed store tasks (`glm53.exporter.collector.l2_families`), at 0 as the
exporter first serves it. L2 traffic is salted, as with per-request or per-tenant `cache_salt`s: LMCache splits its
`*_chunks_total` counters by salt, so each salt's series is born at its final value and Prometheus sees no growth in
them; the scenarios hold those counters still and grow only the unsalted ones (requests, prefetch failures, the
exporter's failure count).
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from glm53.exporter.collector import l2_families, passthrough_families
from glm53.exporter.upstream import parse_exposition
from glm53.pod import chart
from glm53.pod.contract import DEFAULT_RELEASE, ENGINE_CONTAINER, EXPORTER_CONTAINER
from tests.exporter.real_l2 import (
    FS_PAGE,
    FS_UNREADABLE_PAGE,
    L2_FAMILY_PREFIXES,
    OFF_PAGE,
    RESP_KILLED_PAGE,
    RESP_UNREACHABLE_PAGE,
)
from tests.support.dockerkit import require_tool

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"
MONITORING_VALUES = REPO / "charts/glm53/ci/monitoring-values.yaml"
# The page each scraped container serves (the ServiceMonitor's `http` endpoint is vLLM's, `metrics` the exporter's).
PAGES = {
    ENGINE_CONTAINER: FIXTURES / "healthy-pod-vllm.prom",
    EXPORTER_CONTAINER: FIXTURES / "healthy-pod-exporter.prom",
}
# The Prometheus Operator's default rule evaluation interval (prometheus-operator pkg/prometheus/promcfg.go,
# generateConfig: evaluationInterval "30s" unless the Prometheus object sets one).
EVALUATION_INTERVAL = "30s"
# A pod of the chart's Deployment (<deployment>-<pod-template-hash>-<suffix>) and its IP: the values Kubernetes picks.
POD_SUFFIX = "-6c9f7b5d8-q4x2z"
POD_IP = "10.42.0.17"
# The pod a rollout replaces it with: a new pod-template-hash, another suffix and IP.
NEW_POD_SUFFIX = "-7d5c8f6b4-m8k3w"
NEW_POD_IP = "10.42.0.23"
# The series Prometheus writes for every target it scrapes (value 1 when the scrape succeeded, 0 when it failed) that
# the alerts read; it is on no page.
UP = "up"
# When a fault starts and how long a healthy pod is watched, in minutes.
FAULT_AT = 5.0
HEALTHY_FOR = 30.0

Labels = tuple[tuple[str, str], ...]


# --- the chart: rules and how Prometheus labels what it scrapes ---------------------------------------------------


@dataclass(frozen=True)
class RenderedMonitoring:
    """What the chart renders for monitoring: the rule groups, the scrape interval and each scraped container's
    target labels."""

    groups: list[dict[str, Any]]
    scrape_interval: str
    runbook_base_url: str
    targets: dict[str, dict[str, str]]  # container name -> the labels its samples get

    def rules(self) -> dict[str, dict[str, Any]]:
        return {rule["alert"]: rule for group in self.groups for rule in group["rules"]}


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"the monitoring render has {len(found)} {kind} objects, expected one"
    return found[0]


def target_labels(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels of each container the ServiceMonitor scrapes, as the Prometheus Operator relabels its targets
    (prometheus-operator pkg/prometheus/promcfg.go, generateServiceMonitorConfig: namespace, service, pod, container,
    job from the Service's name, endpoint from the endpoint's port, and instance, the address scraped)."""
    monitor = _one(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [o for o in objects if o["kind"] == "Service" and selector.items() <= o["metadata"]["labels"].items()]
    assert len(services) == 1, f"the ServiceMonitor selects {len(services)} Services, expected one"
    service = services[0]
    deployment = _one(objects, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    targets = {}
    for endpoint in monitor["spec"]["endpoints"]:
        port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
        container, number = next(
            (c["name"], p["containerPort"])
            for c in containers
            for p in c.get("ports", [])
            if p["name"] == port["targetPort"]
        )
        targets[container] = {
            "namespace": service["metadata"]["namespace"],
            "service": service["metadata"]["name"],
            "job": service["metadata"]["name"],
            "pod": deployment["metadata"]["name"] + POD_SUFFIX,
            "container": container,
            "endpoint": endpoint["port"],
            "instance": f"{POD_IP}:{number}",
        }
    return targets


@pytest.fixture(scope="module")
def monitoring() -> RenderedMonitoring:
    values = yaml.safe_load(MONITORING_VALUES.read_text())
    objects = chart.render(values)
    intervals = {e["interval"] for e in _one(objects, "ServiceMonitor")["spec"]["endpoints"]}
    assert len(intervals) == 1, f"the ServiceMonitor's endpoints scrape at different intervals: {intervals}"
    return RenderedMonitoring(
        groups=_one(objects, "PrometheusRule")["spec"]["groups"],
        scrape_interval=intervals.pop(),
        runbook_base_url=values["monitoring"]["prometheusRule"]["runbookBaseUrl"],
        targets=target_labels(objects),
    )


# --- the healthy pod: captured pages as series --------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Series:
    """One time series as Prometheus stores it: a name and its labels (sorted)."""

    name: str
    labels: Labels

    def notation(self) -> str:
        """promtool's series notation, `name{label="value",...}`, with PromQL's string escapes."""
        quoted = ",".join(f'{key}="{_escape(value)}"' for key, value in self.labels)
        return f"{self.name}{{{quoted}}}"

    def picked_by(self, name: str | None, labels: Mapping[str, str]) -> bool:
        """Whether a change of series `name` (None: any name) with these labels applies to this series."""
        return name in (None, self.name) and labels.items() <= dict(self.labels).items()

    def moved(self, pod: str, ip: str) -> Series:
        """This series as another pod serves it: the `pod` label and the address in `instance` are that pod's."""
        labels = dict(self.labels)
        labels["pod"] = pod
        labels["instance"] = f"{ip}:{labels['instance'].rpartition(':')[2]}"
        return Series(self.name, tuple(sorted(labels.items())))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def scraped(page: str, target: Mapping[str, str]) -> dict[Series, float]:
    """The samples of an exposition page with the target's labels added, as Prometheus ingests them.

    The chart's ServiceMonitor leaves honor_labels off, so a page's own label that collides with a target label would
    be renamed `exported_<name>`; the captured pages have none, and a page that gains one fails here rather than being
    stored under a name no alert reads.
    """
    samples: dict[Series, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            clash = sample.labels.keys() & target.keys()
            assert not clash, f"{sample.name} carries the target label(s) {sorted(clash)}; Prometheus renames them"
            samples[Series(sample.name, tuple(sorted({**sample.labels, **target}.items())))] = sample.value
    return samples


def healthy_pod(targets: Mapping[str, Mapping[str, str]]) -> dict[Series, float]:
    """Both captured pages as Prometheus holds them after scraping the healthy pod, and each target's `up` (1: its
    scrape succeeded), which Prometheus writes with the target's labels and nothing else."""
    pod: dict[Series, float] = {}
    for container, page in PAGES.items():
        samples = scraped(page.read_text(encoding="utf-8"), targets[container])
        assert UP not in {series.name for series in samples}, f"the {container} page serves {UP} itself"
        pod.update(samples)
        pod[Series(UP, tuple(sorted(targets[container].items())))] = 1.0
    return pod


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


# The exporter's own L2 family: failed store tasks it counted in the pod's one server's log.
L2_STORE_FAILURES = "glm53_lmcache_l2_store_failures_total"


def exporter_l2_page(server_page: Path) -> str:
    """The L2 tier's families of a captured `lmcache server` page as the exporter serves them: its pass-through of the
    pod's one server, and its count of that server's failed store tasks, 0 until one fails, rendered by
    prometheus_client as the exporter's /metrics renders its registry."""
    snapshot = parse_exposition(server_page.read_text(encoding="utf-8"))
    passed = [f for f in passthrough_families([snapshot]) if f.name.startswith(L2_FAMILY_PREFIXES)]
    registry = CollectorRegistry()
    registry.register(_Families(passed + l2_families([("", 0)])))
    return generate_latest(registry).decode()


def with_l2_tier(
    pod: Mapping[Series, float], server_page: Path, targets: Mapping[str, Mapping[str, str]]
) -> dict[Series, float]:
    """The pod with the L2 tier of `server_page`: its exporter page's L2 families are that server's."""
    exporter = targets[EXPORTER_CONTAINER]
    l2_names = (*L2_FAMILY_PREFIXES, L2_STORE_FAILURES)
    kept = {s: v for s, v in pod.items() if not (s.name.startswith(l2_names) and s.picked_by(None, exporter))}
    return {**kept, **scraped(exporter_l2_page(server_page), exporter)}


# --- time: promtool's expanding notation at the scrape interval ---------------------------------------------------


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)


def seconds(duration: str) -> int:
    """A Prometheus duration the chart renders (`30s`, `1m`, `2h`) in seconds."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, f"unsupported duration {duration!r}"
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


@dataclass(frozen=True)
class Timeline:
    """Samples every `scrape_s` seconds from 0 to `end_min` minutes; a fault starts at `fault_min`."""

    scrape_s: int
    fault_min: float
    end_min: float

    def scrapes(self, minutes: float) -> int:
        return round(minutes * 60 / self.scrape_s)

    def per_scrape(self, per_minute: float) -> float:
        return per_minute * self.scrape_s / 60

    def held(self, value: float) -> str:
        return f"{_number(value)}+0x{self.scrapes(self.end_min)}"

    def runs(self, start: float, per_minute: float, after: float, after_per_minute: float) -> str:
        """Up to the fault: from `start`, growing `per_minute`; from the fault to the end: from `after`, growing
        `after_per_minute` (promtool's `a+bxn` is n+1 samples: a, a+b, ..., a+n*b)."""
        before, total = self.scrapes(self.fault_min), self.scrapes(self.end_min)
        first = f"{_number(start)}+{_number(self.per_scrape(per_minute))}x{before - 1}"
        return f"{first} {_number(after)}+{_number(self.per_scrape(after_per_minute))}x{total - before}"

    def stale(self, value: float) -> str:
        """Held until the fault, then a staleness marker: the scrape failed and Prometheus dropped the series."""
        return f"{_number(value)}+0x{self.scrapes(self.fault_min) - 1} stale"

    def arrives(self, value: float) -> str:
        """No sample until the fault, then held: a target that appeared at the fault."""
        before = self.scrapes(self.fault_min)
        return f"_x{before} {_number(value)}+0x{self.scrapes(self.end_min) - before}"


# How a faulty series evolves, from its healthy value.
Values = Callable[[Timeline, float], str]


def becomes(after: float) -> Values:
    """A gauge that flips to `after` when the fault starts."""
    return lambda timeline, value: timeline.runs(value, 0.0, after, 0.0)


def counts(per_minute: float) -> Values:
    """A counter that starts counting `per_minute` when the fault starts."""
    return lambda timeline, value: timeline.runs(value, 0.0, value + timeline.per_scrape(per_minute), per_minute)


def jumps(by: float) -> Values:
    """A counter that goes up once, by `by`, when the fault starts."""
    return lambda timeline, value: timeline.runs(value, 0.0, value + by, 0.0)


def serving(after: float) -> Values:
    """A counter under steady traffic: each minute it grows by its whole captured value (so the pod's ratios stay the
    captured ones), and from the fault by `after` times that."""

    def values(timeline: Timeline, value: float) -> str:
        at_fault = value + timeline.scrapes(timeline.fault_min) * timeline.per_scrape(value)
        return timeline.runs(value, value, at_fault, value * after)

    return values


def starts_serving() -> Values:
    """A counter that stands still until the fault and from then on grows each minute by its whole captured value."""
    return lambda timeline, value: timeline.runs(value, 0.0, value + timeline.per_scrape(value), value)


def down_for(minutes: float) -> Values:
    """A gauge that reads 0 from the fault for `minutes`, then its healthy value again: a target that recovers."""

    def values(timeline: Timeline, value: float) -> str:
        before, down = timeline.scrapes(timeline.fault_min), timeline.scrapes(minutes)
        after = timeline.scrapes(timeline.end_min) - before - down
        return f"{_number(value)}+0x{before - 1} 0+0x{down - 1} {_number(value)}+0x{after}"

    return values


def jumps_after(minutes: float, by: float) -> Values:
    """A counter that goes up once, by `by`, `minutes` after the fault starts (a restart, seen once the target is
    back)."""

    def values(timeline: Timeline, value: float) -> str:
        before = timeline.scrapes(timeline.fault_min + minutes)
        return f"{_number(value)}+0x{before - 1} {_number(value + by)}+0x{timeline.scrapes(timeline.end_min) - before}"

    return values


def appears() -> Values:
    """A series that is not there until the fault and is then held at its captured value (a gauge observed only while
    its condition holds)."""
    return lambda timeline, value: timeline.arrives(value)


# --- the cases ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """The healthy pod's series `name` (None: every name) with `labels`, each of them made to evolve as `values` (a
    later change of a scenario that picks the same series wins)."""

    name: str | None
    values: Values
    labels: Mapping[str, str]


def change(name: str | None, values: Values, **labels: str) -> Change:
    return Change(name, values, labels)


@dataclass(frozen=True)
class Scenario:
    """The healthy pod, with `changes` from `fault_min` on, watched until `check_min` (minutes); `rollout`: from the
    fault on, a new pod (NEW_POD_SUFFIX at NEW_POD_IP) serves the same pages, healthy; `l2`: the pod runs the L2 tier
    of this captured server page."""

    name: str
    changes: tuple[Change, ...]
    check_min: float
    fault_min: float = FAULT_AT
    rollout: bool = False
    l2: Path | None = None


@dataclass(frozen=True)
class Fault:
    """A scenario and the one alert it must raise at its check: the severity, the labels the alert keeps beyond the
    exporter target's (`labels`), restricted to `by` when the expression aggregates, and the summary as an operator
    reads it."""

    alert: str
    scenario: Scenario
    severity: str
    summary: str
    labels: Mapping[str, str]
    by: tuple[str, ...] | None = None


# The pod the summaries name: the chart's Deployment (named after the release) plus POD_SUFFIX.
POD = DEFAULT_RELEASE + POD_SUFFIX
BY_POD = ("namespace", "pod")
# The hit-ratio alert compares the last 15 minutes with the 6 hours before them: traffic runs that long first.
BASELINE_MIN = 6 * 60 + 30
HEALTHY = Scenario("healthy-pod", (), check_min=HEALTHY_FOR, fault_min=HEALTHY_FOR)
# A failed scrape of the exporter: its target's `up` turns 0 and the series of its page go stale.
EXPORTER_DOWN = (
    change(None, Timeline.stale, container=EXPORTER_CONTAINER),
    change(UP, becomes(0.0), container=EXPORTER_CONTAINER),
)
# A rollout: the old pod's targets leave service discovery, so Prometheus marks every series of theirs stale, `up`
# included, and a new pod serves the same pages.
ROLLOUT = Scenario("a-rollout-replaces-the-pod", (change(None, Timeline.stale),), HEALTHY_FOR, rollout=True)
# Steady traffic at the captured pod's own hit ratio, for as long as the collapse scenario: the ratio never moves.
STEADY_TRAFFIC = Scenario(
    "steady-traffic-at-the-captured-hit-ratio",
    (
        change("glm53_prefix_cache_hit_tokens_total", serving(1.0), scope="external"),
        change("glm53_prefix_cache_queried_tokens_total", serving(1.0), scope="external"),
    ),
    fault_min=BASELINE_MIN,
    check_min=BASELINE_MIN + 30,
)

# The L2 tier's unsalted request counters: under salted traffic the only ones of its store and load counters that grow.
L2_REQUESTS = (
    "lmcache_mp_l2_store_submitted_requests_total",
    "lmcache_mp_l2_store_completed_requests_total",
    "lmcache_mp_l2_prefetch_load_submitted_requests_total",
    "lmcache_mp_l2_load_completed_requests_total",
)
# A pod without an L2 tier: no adapter attached, none of the tier's counters.
NO_L2 = Scenario("a-pod-without-an-l2-tier", (), check_min=HEALTHY_FOR, fault_min=HEALTHY_FOR, l2=OFF_PAGE)
# A pod whose fs L2 tier stores and loads salted traffic steadily: each minute as many requests as the captured server
# served; no store task fails, and the salted chunk counters' new series add nothing a rate() sees.
L2_STEADY = Scenario(
    "an-fs-l2-tier-storing-and-loading-salted-traffic-steadily",
    tuple(change(name, serving(1.0)) for name in L2_REQUESTS),
    check_min=HEALTHY_FOR,
    fault_min=HEALTHY_FOR,
    l2=FS_PAGE,
)
# The captured resp tier once its Redis was killed: each store request's one task (one adapter) fails, and logs so.
RESP_KILLED_STORES_PER_MINUTE = parse_exposition(RESP_KILLED_PAGE.read_text(encoding="utf-8")).total(
    "lmcache_mp_l2_store_submitted_requests_total"
)
L2_SUMMARY = f"The LMCache L2 tier on {POD} fails or hangs on its stores or loads"

FAULTS = (
    Fault(
        "Glm53GeometryMismatch",
        Scenario(
            "the-geometry-stops-matching", (change("glm53_geometry_matches_profile", becomes(0.0)),), FAULT_AT + 3
        ),
        "critical",
        f"LMCache cache geometry on {POD} does not match the model profile",
        labels={},
    ),
    Fault(
        "Glm53GeometryMismatch",
        Scenario(
            "the-startup-probe-says-wrong",
            (
                change("glm53_probe_status", becomes(1.0), status="wrong"),
                change("glm53_probe_status", becomes(0.0), status="ready"),
            ),
            FAULT_AT + 3,
        ),
        "critical",
        f"LMCache cache geometry on {POD} does not match the model profile",
        labels={"status": "wrong"},
    ),
    Fault(
        "Glm53LMCacheUnreachable",
        Scenario(
            "lmcache-does-not-answer", (change("glm53_upstream_up", becomes(0.0), target="lmcache"),), FAULT_AT + 3
        ),
        "critical",
        f"LMCache sidecar on {POD} is not answering its metrics endpoint",
        labels={"target": "lmcache"},
    ),
    Fault(
        "Glm53LMCacheRestarting",
        Scenario(
            "lmcache-restarts-once",
            (change("glm53_upstream_restarts_total", jumps(1.0), target="lmcache"),),
            FAULT_AT + 2,
        ),
        "warning",
        f"LMCache sidecar on {POD} restarted in the last 15 minutes",
        labels={"target": "lmcache"},
    ),
    Fault(
        "Glm53ExternalHitRatioCollapsed",
        Scenario(
            "lmcache-stops-serving-hits-under-steady-traffic",
            (
                change("glm53_prefix_cache_hit_tokens_total", serving(0.0), scope="external"),
                change("glm53_prefix_cache_queried_tokens_total", serving(1.0), scope="external"),
            ),
            fault_min=BASELINE_MIN,
            check_min=BASELINE_MIN + 30,
        ),
        "warning",
        f"External (LMCache) hit ratio on {POD} fell below a quarter of its 6-hour baseline",
        labels={},
        by=BY_POD,
    ),
    Fault(
        "Glm53SidecarUnknownEngine",
        Scenario(
            "the-sidecar-lists-no-engine", (change("glm53_sidecar_registered_engines", becomes(0.0)),), FAULT_AT + 3
        ),
        "critical",
        f"The LMCache sidecar on {POD} has no engine registered: caching is dead",
        labels={},
    ),
    Fault(
        "Glm53SidecarLinkDegraded",
        Scenario("a-heartbeat-ping-fails", (change("glm53_sidecar_link_degraded", becomes(1.0)),), FAULT_AT + 3),
        "warning",
        f"vLLM on {POD} serves in degraded mode: its LMCache sidecar does not answer",
        labels={},
    ),
    Fault(
        "Glm53SidecarRejectsStores",
        Scenario(
            "the-sidecar-rejects-stores",
            (change("glm53_sidecar_link_events_total", counts(1.0), event="store_rejected"),),
            FAULT_AT + 2,
        ),
        "critical",
        f"The LMCache sidecar on {POD} rejects the engine's stores or retrieves",
        labels={},
        by=BY_POD,
    ),
    Fault(
        "Glm53KvLoadFailures",
        Scenario(
            "kv-loads-fail",
            (change("glm53_sidecar_link_events_total", counts(1.0), event="load_failed"),),
            FAULT_AT + 2,
        ),
        "warning",
        f"Requests on {POD} failed to load their KV cache from the LMCache sidecar",
        labels={},
        by=BY_POD,
    ),
    Fault(
        "Glm53LMCacheL2Failing",
        Scenario(
            # What the captured resp tier did once its Redis was killed, under salted traffic: stores are still
            # submitted and each still counts a completed request, but every store task fails and says so in the log.
            "salted-stores-fail-once-redis-is-killed",
            (
                *(change(name, serving(1.0)) for name in L2_REQUESTS[:2]),
                change(L2_STORE_FAILURES, counts(RESP_KILLED_STORES_PER_MINUTE or 0.0)),
            ),
            FAULT_AT + 15,
            l2=RESP_KILLED_PAGE,
        ),
        "warning",
        L2_SUMMARY,
        labels={},
        by=BY_POD,
    ),
    Fault(
        "Glm53LMCacheL2Failing",
        Scenario(
            # As the captured fs tier whose chunk files were cut short: every chunk a lookup found fails to load.
            "l2-loads-fail",
            (
                change("lmcache_mp_l2_prefetch_load_submitted_requests_total", serving(1.0)),
                change("lmcache_mp_l2_prefetch_failure_chunks_total", starts_serving(), reason="not_found"),
            ),
            FAULT_AT + 15,
            l2=FS_UNREADABLE_PAGE,
        ),
        "warning",
        L2_SUMMARY,
        labels={},
        by=BY_POD,
    ),
    *(
        Fault("Glm53LMCacheL2Failing", scenario, "warning", L2_SUMMARY, labels={}, by=BY_POD)
        for scenario in (
            # As the captured resp tier whose Redis never answered: the store stays in flight and none completes;
            # nothing else is sent (held counters), so only the hung store shows it.
            Scenario(
                "an-l2-store-hangs-on-a-redis-that-never-answered",
                (change("lmcache_mp_num_inflight_l2_stores", appears()),),
                FAULT_AT + 12,
                l2=RESP_UNREACHABLE_PAGE,
            ),
            # The same tier under traffic: stores keep being submitted, and no stored-chunks series exists at all.
            Scenario(
                "stores-go-to-a-redis-that-never-answered",
                (
                    change("lmcache_mp_num_inflight_l2_stores", appears()),
                    change("lmcache_mp_l2_store_submitted_requests_total", starts_serving()),
                ),
                FAULT_AT + 12,
                l2=RESP_UNREACHABLE_PAGE,
            ),
        )
    ),
    *(
        Fault(
            "Glm53ExporterScrapeFailing",
            scenario,
            "warning",
            f"Scrapes of the glm53 exporter on {POD} fail or take over 5 seconds",
            labels={},
        )
        for scenario in (
            Scenario("the-exporter-stops-answering", EXPORTER_DOWN, FAULT_AT + 7),
            # Well past any lookback over the exporter's own series: the outage still pages.
            Scenario("the-exporter-stays-down-for-40-minutes", EXPORTER_DOWN, FAULT_AT + 40),
            Scenario(
                "scrapes-take-seven-seconds", (change("glm53_scrape_duration_seconds", becomes(7.0)),), FAULT_AT + 7
            ),
        )
    ),
    Fault(
        "Glm53UpstreamScrapeErrors",
        Scenario(
            "vllm-is-unreachable-at-every-scrape",
            (change("glm53_upstream_errors_total", counts(2.0), target="vllm", reason="unreachable"),),
            FAULT_AT + 22,
        ),
        "warning",
        f"The glm53 exporter on {POD} keeps failing to scrape vllm",
        labels={"target": "vllm", "reason": "unreachable"},
        by=("namespace", "pod", "target", "reason"),
    ),
)


# --- promtool's test file -----------------------------------------------------------------------------------------


def input_series(pod: Mapping[Series, float], scenario: Scenario, scrape_s: int) -> list[dict[str, str]]:
    """The pod's series in promtool's notation, each held at its captured value except those the scenario changes."""
    timeline = Timeline(scrape_s, scenario.fault_min, scenario.check_min)
    values = {series: timeline.held(value) for series, value in pod.items()}
    for step in scenario.changes:
        picked = [series for series in pod if series.picked_by(step.name, step.labels)]
        assert picked, (
            f"{scenario.name}: the healthy pod has no series {step.name or '*'}{dict(step.labels)}; a scenario changes "
            "the captured pod's series and invents none"
        )
        for series in picked:
            values[series] = step.values(timeline, pod[series])
    if scenario.rollout:
        new_pod = DEFAULT_RELEASE + NEW_POD_SUFFIX
        values.update({series.moved(new_pod, NEW_POD_IP): timeline.arrives(value) for series, value in pod.items()})
    return [{"series": series.notation(), "values": values[series]} for series in sorted(values)]


_LABEL_REFERENCE = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")


def expand(alert: str, template: str, labels: Mapping[str, str]) -> str:
    """An annotation as Prometheus renders it for these labels; only `{{ $labels.x }}` is supported, and a reference to
    a label the alert lacks fails (Go's template would print an empty string to the operator)."""

    def label(match: re.Match[str]) -> str:
        key = match.group(1)
        assert key in labels, f"{alert} refers to $labels.{key}, which the alert does not carry: {sorted(labels)}"
        return labels[key]

    expanded = _LABEL_REFERENCE.sub(label, template)
    assert "{{" not in expanded, f"{alert}: a template construct this test cannot expand: {template!r}"
    return expanded


def expected_alert(fault: Fault, monitoring: RenderedMonitoring) -> dict[str, Any]:
    """What promtool must find firing: every label (the rule's own `severity` included, `alertname` not) and every
    annotation, the runbook link as the chart rewrote it."""
    kept = {**monitoring.targets[EXPORTER_CONTAINER], **fault.labels}
    labels = {key: value for key, value in kept.items() if fault.by is None or key in fault.by}
    rule = monitoring.rules()[fault.alert]
    annotations = {
        "summary": fault.summary,
        "description": expand(fault.alert, rule["annotations"]["description"], labels),
        "runbook_url": f"{monitoring.runbook_base_url}#{fault.alert.lower()}",
    }
    return {"exp_labels": {**labels, "severity": fault.severity}, "exp_annotations": annotations}


@dataclass(frozen=True)
class Check:
    """At `minute`, the alerts named `alert` that promtool must find firing (none: the alert is silent)."""

    alert: str
    minute: float
    firing: tuple[dict[str, Any], ...] = ()


def promtool_group(
    scenario: Scenario, checks: Iterable[Check], pod: Mapping[Series, float], scrape_interval: str
) -> dict[str, Any]:
    """One test group of promtool's test file: the scenario's series and its checks."""
    return {
        "name": scenario.name,
        "interval": scrape_interval,
        "input_series": input_series(pod, scenario, seconds(scrape_interval)),
        "alert_rule_test": [
            {"alertname": check.alert, "eval_time": f"{round(check.minute * 60)}s", "exp_alerts": list(check.firing)}
            for check in checks
        ],
    }


def run_promtool(group: dict[str, Any], rule_groups: list[dict[str, Any]], workdir: Path) -> None:
    """`promtool test rules` on the rendered rules; its own report is the failure message."""
    promtool = require_tool("promtool", "33-promtool.sh")
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": EVALUATION_INTERVAL, "tests": [group]}
    for name, document in (("rules.yaml", {"groups": rule_groups}), ("tests.yaml", tests)):
        # libyaml's dumper: the pure-Python one spends longer on a 7-hour scenario's series than promtool does.
        (workdir / name).write_text(yaml.dump(document, Dumper=yaml.CSafeDumper, sort_keys=False))
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"], cwd=workdir, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"promtool test rules failed ({done.returncode}):\n{done.stdout}{done.stderr}"


def selected_names(expr: str) -> set[str]:
    """The metric names an expression selects, by a real PromQL parser."""
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


# --- the tests ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pod(monitoring: RenderedMonitoring) -> dict[Series, float]:
    return healthy_pod(monitoring.targets)


def scenario_pod(
    scenario: Scenario, pod: Mapping[Series, float], monitoring: RenderedMonitoring
) -> dict[Series, float]:
    """The pod a scenario starts from: the healthy one, with the scenario's L2 tier if it has one."""
    return dict(pod) if scenario.l2 is None else with_l2_tier(pod, scenario.l2, monitoring.targets)


def test_every_alert_the_chart_renders_has_a_fault_that_fires_it(monitoring: RenderedMonitoring) -> None:
    assert {fault.alert for fault in FAULTS} == set(monitoring.rules())
    assert len({fault.scenario.name for fault in FAULTS}) == len(FAULTS)


def test_the_healthy_pod_serves_every_series_the_alerts_read(
    monitoring: RenderedMonitoring, pod: dict[Series, float]
) -> None:
    """Otherwise an alert would be silent on it only for lack of input. The L2 tier's series are served by a pod with
    one, and its failure counters once something failed (they appear with their first count)."""
    l2_pods = [scenario_pod(f.scenario, pod, monitoring) for f in FAULTS if f.scenario.l2 is not None]
    served = {series.name for one in (pod, *l2_pods) for series in one}
    for alert, rule in monitoring.rules().items():
        missing = selected_names(rule["expr"]) - served
        assert not missing, (
            f"{alert} reads {sorted(missing)}, which the captured pages lack; run tests/support/real_pod.py "
            "(or tests/exporter/real_l2.py for the L2 tier's)"
        )


@pytest.mark.parametrize("fault", FAULTS, ids=lambda fault: f"{fault.alert}-{fault.scenario.name}")
def test_the_fault_fires_its_alert(
    fault: Fault, monitoring: RenderedMonitoring, pod: dict[Series, float], tmp_path: Path
) -> None:
    """Silent up to the last scrape before the fault, firing at the check."""
    scenario = fault.scenario
    before = scenario.fault_min - seconds(monitoring.scrape_interval) / 60
    checks = [Check(fault.alert, before), Check(fault.alert, scenario.check_min, (expected_alert(fault, monitoring),))]
    base = scenario_pod(scenario, pod, monitoring)
    run_promtool(promtool_group(scenario, checks, base, monitoring.scrape_interval), monitoring.groups, tmp_path)


@pytest.mark.parametrize("scenario", [HEALTHY, NO_L2, L2_STEADY], ids=lambda scenario: scenario.name)
def test_no_alert_fires_on_the_healthy_pod(
    scenario: Scenario, monitoring: RenderedMonitoring, pod: dict[Series, float], tmp_path: Path
) -> None:
    """Every alert, in one promtool run (its report names the alert that fired): on the captured pod, on that pod
    without an L2 tier, and with an fs L2 tier that stores and loads every chunk of salted traffic, as the captured one
    did."""
    checks = [Check(alert, scenario.check_min) for alert in monitoring.rules()]
    base = scenario_pod(scenario, pod, monitoring)
    run_promtool(promtool_group(scenario, checks, base, monitoring.scrape_interval), monitoring.groups, tmp_path)


def test_no_alert_fires_through_a_rollout(
    monitoring: RenderedMonitoring, pod: dict[Series, float], tmp_path: Path
) -> None:
    """The old pod's series end and a healthy new pod takes over: every alert silent at every minute, for both pods."""
    minutes = range(int(ROLLOUT.fault_min), int(ROLLOUT.check_min) + 1)
    checks = [Check(alert, minute) for minute in minutes for alert in monitoring.rules()]
    run_promtool(promtool_group(ROLLOUT, checks, pod, monitoring.scrape_interval), monitoring.groups, tmp_path)


def test_the_hit_ratio_alert_stays_silent_under_steady_traffic(
    monitoring: RenderedMonitoring, pod: dict[Series, float], tmp_path: Path
) -> None:
    """The near miss of the collapse scenario: the same hours of traffic, the ratio never moving."""
    checks = [Check("Glm53ExternalHitRatioCollapsed", STEADY_TRAFFIC.check_min)]
    group = promtool_group(STEADY_TRAFFIC, checks, pod, monitoring.scrape_interval)
    run_promtool(group, monitoring.groups, tmp_path)


# The sidecar SIGKILLed: its metrics endpoint is down for SIDECAR_DOWN_MIN (the kubelet's restart back-off and the
# server's start), then it answers again, its restart counted once it does.
SIDECAR_DOWN_MIN = 4.0
SIDECAR_KILLED = Scenario(
    "the-sidecar-is-killed-and-comes-back",
    (
        change("glm53_upstream_up", down_for(SIDECAR_DOWN_MIN), target="lmcache"),
        change("glm53_upstream_restarts_total", jumps_after(SIDECAR_DOWN_MIN, 1.0), target="lmcache"),
    ),
    check_min=FAULT_AT + SIDECAR_DOWN_MIN + 20,
)


def test_the_sidecar_alerts_clear_after_it_recovers(
    monitoring: RenderedMonitoring, pod: dict[Series, float], tmp_path: Path
) -> None:
    """An alert that stays after its fault ended trains operators to ignore it: Unreachable fires while the endpoint
    is down and clears at the first evaluation after it answers; Restarting fires once the restart is counted and
    clears when the restart leaves its 15-minute window. Every other alert stays silent throughout."""
    back = SIDECAR_KILLED.fault_min + SIDECAR_DOWN_MIN
    # What each alert says when it fires, as its own fault above expects it.
    firing = {
        fault.alert: (expected_alert(fault, monitoring),)
        for fault in FAULTS
        if fault.alert in ("Glm53LMCacheUnreachable", "Glm53LMCacheRestarting")
    }
    assert len(firing) == 2
    others = [alert for alert in monitoring.rules() if alert not in firing]
    checks = [
        Check("Glm53LMCacheUnreachable", back - 0.5, firing["Glm53LMCacheUnreachable"]),
        Check("Glm53LMCacheUnreachable", back + 1),
        Check("Glm53LMCacheRestarting", back + 1, firing["Glm53LMCacheRestarting"]),
        Check("Glm53LMCacheRestarting", back + 17),
        *(Check(alert, minute) for alert in others for minute in (back - 0.5, back + 1, back + 17)),
    ]
    group = promtool_group(SIDECAR_KILLED, checks, pod, monitoring.scrape_interval)
    run_promtool(group, monitoring.groups, tmp_path)
