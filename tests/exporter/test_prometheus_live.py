"""The chart's alerts and dashboard evaluated by a real Prometheus (Debian's 2.42.0) on the running CPU pod.

tests/exporter/test_alert_rules.py proves each alert on series built from captured pages (promtool); here nothing is
built: the chart's pod runs on loopback with the engine stand-in and the real `lmcache server` sidecar, a real
Prometheus scrapes its vLLM and exporter endpoints as the chart's ServiceMonitor would (the Prometheus Operator's
target labels, `glm53.pod.prometheus`) and evaluates the PrometheusRule the chart renders, every second. One pod
and one Prometheus serve three tests, after one burst of traffic: the healthy pod raises nothing, every dashboard
panel answers or is empty for a reason named here, and a SIGKILLed sidecar (restarted as the kubelet would, after the
chart's restart hold) raises what the runbook says and settles. A fourth starts a pod with a wrong chunk size, which
never turns Ready: the geometry alert fires.

The engine stand-in is enough: every alert reads the exporter's series (the log facts, and the sidecar's pages and
/status), which come from the real sidecar and from log lines the stand-in writes as vLLM 0.33 and LMCache's connector
do.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from glm53.pod.contract import SIDECAR_CONTAINER
from glm53.pod.faults.load import LoadShape
from glm53.pod.faults.suite import load_on
from glm53.pod.kubelet import kubelet
from glm53.pod.loopback import RunningPod, quiet, running_pod
from glm53.pod.main_job import PodAddresses, PodOptions, pod_values, render_plans, started_pod
from glm53.pod.prometheus import (
    Alert,
    AlertsSeen,
    ChartMonitoring,
    Prometheus,
    alert_report,
    chart_monitoring,
    loopback_pod_name,
    prometheus,
    scrape_targets,
)
from glm53.profiles import get_profile
from tests.support.plan_edits import with_chunk_size

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts/glm53/files/glm53-dashboard.json"
FLASH = get_profile("glm53-flash")
# The exporter on, and vLLM's own prefix cache two documents small (the stand-in's --num-gpu-blocks-override, as the
# fault suite gives the real engine), so that a reload, two documents later, is served from LMCache.
LOCAL_BLOCKS = 6
VALUES = {"exporter": {"enabled": True}, "mock": {"vllmExtraArgs": ["--num-gpu-blocks-override", str(LOCAL_BLOCKS)]}}
# Reloads (a document sent again after two others) the traffic waits for, and then scrapes while it still runs.
RELOADS = 4
SCRAPES_UNDER_LOAD = 2
UNREACHABLE = "Glm53LMCacheUnreachable"
RESTARTING = "Glm53LMCacheRestarting"
# What a sidecar kill may raise besides those two, each pending only (its `for:` outlasts the outage), as measured:
# the engine's heartbeat fails after 10-20 s (degraded), the restarted server has no engine until the next ping
# re-registers it, and the exporter counts a failed scrape of the sidecar at each of Prometheus's scrapes.
PENDING_DURING_A_RESTART = {"Glm53SidecarLinkDegraded", "Glm53SidecarUnknownEngine", "Glm53UpstreamScrapeErrors"}
# Still active once the pod has recovered, by their ranges: Restarting reads the last 15 minutes, UpstreamScrapeErrors
# the last 10 (more than 3 failed scrapes: at one scrape a second, the outage counts about 30).
ACTIVE_AFTER_RECOVERY = {(RESTARTING, "firing"), ("Glm53UpstreamScrapeErrors", "pending")}
UNREACHABLE_WITHIN_S = 30.0
RECOVERED_WITHIN_S = 90.0
SETTLED_WITHIN_S = 60.0


@dataclass(frozen=True)
class LivePod:
    pod: RunningPod
    name: str  # its `pod` label
    monitoring: ChartMonitoring
    prometheus: Prometheus


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LivePod]:
    """The chart's CPU pod with the exporter, a Prometheus scraping it, after a burst of traffic."""
    workdir = tmp_path_factory.mktemp("prometheus-live")
    options = PodOptions(FLASH, validation=False, values=VALUES)
    plans = render_plans(options)
    name = loopback_pod_name(plans.serving)
    monitoring = chart_monitoring(pod_values(options), name)
    with started_pod(plans, workdir / "pod", quiet) as pod:
        targets = scrape_targets(monitoring, pod.plan)
        urls = PodAddresses.of(pod.plan)
        assert {t.url for t in targets} == {urls.exporter, f"{urls.vllm}/metrics"}, targets
        with prometheus(monitoring.rules, targets, workdir / "prometheus") as server:
            server.wait_scraped(time.time())
            chunk = int(pod.plan.container(SIDECAR_CONTAINER).option("--chunk-size"))
            load = load_on(pod.plan, LoadShape(clients=2, document_tokens=3 * chunk), FLASH.strict_prefix, 60.0)
            load.start()
            deadline = time.monotonic() + 60.0
            while sum(o.kind == "reload" for o in load.snapshot()) < RELOADS and time.monotonic() < deadline:
                time.sleep(0.2)
            # Traffic across scrapes: LMCache labels its lookup counters by cache_salt, and a salt's series only has
            # a rate once a scrape fell between its document's store and its reload.
            for _ in range(SCRAPES_UNDER_LOAD):
                server.wait_scraped(time.time())
            outcomes = load.stop()
            reloads = [o for o in outcomes if o.kind == "reload"]
            assert len(reloads) >= RELOADS and all(o.result == "ok" and o.hit_tokens for o in reloads), outcomes
            server.wait_settled()
            yield LivePod(pod, name, monitoring, server)


def active(alerts: list[Alert]) -> set[tuple[str, str]]:
    return {(a.name, a.state) for a in alerts}


def test_the_healthy_pod_raises_no_alert_after_traffic(live: LivePod) -> None:
    assert live.prometheus.alerts() == []
    # The rules read real series of this pod, with the target labels they group by.
    up = live.prometheus.query('glm53_upstream_up{target="lmcache"}')
    assert [(s["metric"]["namespace"], s["metric"]["pod"], s["value"][1]) for s in up] == [("default", live.name, "1")]
    exporter_up = live.prometheus.query('up{endpoint="metrics", container="exporter"}')
    assert [s["value"][1] for s in exporter_up] == ["1"]


# --- the dashboard ------------------------------------------------------------------------------------------------

# Grafana's $__rate_interval with its default 15 s scrape-interval setting: max($__interval + 15 s, 4 x 15 s) = 1m;
# at one scrape a second it holds the whole burst of traffic.
RATE_INTERVAL = "1m"
# The panel queries (title, refId) this pod leaves empty, and why. Every other one answers with numbers (none NaN).
# Two of them answer 0 although every document's chunks reached the L2 tier: LMCache labels its L2 counters by
# cache_salt (lmcache 0.5.6 v1/mp_observability/subscribers/metrics/l2.py:133-146, utils.py:20-34), each document
# here has its own salt and is stored once, and a counter's first value is no increase to rate().
EMPTY_PANELS = {
    # L1 (1 GB) holds every document, so nothing is loaded back from the tier.
    ("LMCache L2 tier: stores and loads", "C"): "no L2 load",
    # LMCache's failure counter appears with its first count.
    ("LMCache L2 tier: stores and loads", "D"): "no L2 load has failed",
    # The gauge is observed only while a store is in flight.
    ("LMCache L2 tier: adapters, bytes, stores in flight", "B"): "no L2 store in flight",
    # Staging runs only with weights to fetch (weights.source=none here); its PodMonitor scrapes that step's port.
    ("Weights staged", "A"): "no staging step",
    ("Stage step", "A"): "no staging step",
    ("Staging rate", "A"): "no staging step",
    ("Staging rate", "B"): "no staging step",
}


def dashboard_targets() -> list[tuple[str, str, str]]:
    """Every panel's queries: (title, refId, PromQL with Grafana's variables)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [(p["title"], t["refId"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def grafana_expr(expr: str, pod: str) -> str:
    """The query Grafana sends for `expr` with the pod variable set to the one pod `pod` (a pod name has no character
    Grafana escapes in a regex matcher)."""
    sent = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$pod", pod)
    assert "$" not in sent, f"a Grafana variable this test does not fill is in {expr!r}"
    return sent


@dataclass(frozen=True)
class PanelAnswer:
    """What one panel query returned: the value of each series now."""

    title: str
    ref: str
    numbers: tuple[float, ...]


def test_every_dashboard_panel_answers_or_is_empty_for_a_known_reason(live: LivePod) -> None:
    pods = {s["metric"]["pod"] for s in live.prometheus.query("glm53_probe_status")}  # the variable's query
    assert pods == {live.name}
    answers = []
    for title, ref, expr in dashboard_targets():
        result = live.prometheus.query(grafana_expr(expr, live.name))
        answers.append(PanelAnswer(title, ref, tuple(float(s["value"][1]) for s in result)))
    empty = {(a.title, a.ref) for a in answers if not a.numbers}
    assert empty == set(EMPTY_PANELS), answers
    not_a_number = [a for a in answers if any(math.isnan(n) for n in a.numbers)]
    assert not not_a_number, not_a_number


# --- a sidecar killed ---------------------------------------------------------------------------------------------


@dataclass
class Watch:
    """The pod's alerts seen while watching (glm53.pod.prometheus.AlertsSeen: each with the furthest state it reached),
    every one of them on this pod."""

    prometheus: Prometheus
    pod: str
    seen: AlertsSeen = field(default_factory=lambda: AlertsSeen(frozenset()))

    def watch(self) -> list[Alert]:
        alerts = self.prometheus.alerts()
        for alert in alerts:
            assert alert.labels.get("pod") == self.pod, alert
        self.seen.add(alerts)
        return alerts

    def the(self, name: str) -> Alert | None:
        return next((a for a in self.watch() if a.name == name), None)


def test_a_killed_sidecar_raises_lmcache_unreachable_then_restarting_and_the_pod_settles(live: LivePod) -> None:
    server = live.prometheus
    unreachable_expr: Any = live.monitoring.rule(UNREACHABLE)["expr"]
    with kubelet(live.pod, quiet) as loop:
        watched = Watch(server, live.name)
        os.killpg(live.pod.process(SIDECAR_CONTAINER).process.pid, signal.SIGKILL)
        # Pending, not firing: its `for: 2m` outlasts a restart (the chart holds a restarted sidecar back for
        # lmcache.resilience.restartHoldSeconds, 25 s by default, and the server then starts in about 8 s).
        alert = server.wait_for(f"{UNREACHABLE} active", lambda: watched.the(UNREACHABLE), UNREACHABLE_WITHIN_S)
        assert (alert.state, alert.labels["target"], alert.labels["severity"]) == ("pending", "lmcache", "critical")
        during = server.query(unreachable_expr)
        assert [(s["metric"]["pod"], s["metric"]["target"]) for s in during] == [(live.name, "lmcache")]

        def sidecar_back() -> bool:
            watched.watch()
            return loop.restart_count(SIDECAR_CONTAINER) == 1 and loop.wait_started(SIDECAR_CONTAINER, 0)

        server.wait_for("the sidecar started again", sidecar_back, RECOVERED_WITHIN_S)
        server.wait_for(
            "the alerts of a recovered pod",
            lambda: (found := active(watched.watch())) <= ACTIVE_AFTER_RECOVERY and (RESTARTING, "firing") in found,
            SETTLED_WITHIN_S,
        )
        after = server.query(unreachable_expr)
        restarting = [(a.labels["target"], a.labels["severity"]) for a in server.alerts() if a.name == RESTARTING]
    assert after == []
    assert restarting == [("lmcache", "warning")]
    reached = watched.seen.reached
    fired = {name for name, state in reached.items() if state == "firing"}
    assert fired == {RESTARTING}, reached
    assert reached.get(UNREACHABLE) == "pending", reached
    assert set(reached) <= {UNREACHABLE, RESTARTING, *PENDING_DURING_A_RESTART}, reached


# --- a start the probe refuses --------------------------------------------------------------------------------------

GEOMETRY = "Glm53GeometryMismatch"
# Its `for: 2m` from the exporter's first `wrong` verdict, plus the engine's failed start before it (about 20 s here).
GEOMETRY_FIRES_WITHIN_S = 240.0


def test_a_wrong_chunk_start_fires_the_geometry_alert(tmp_path: Path) -> None:
    """What an operator sees of a pod the probe refuses: the chart renders no chunk size the model's block does not
    divide, so the plan carries 256 for GLM-5.3-Flash as a hand-edited Deployment would (tests/pod/test_main_job.py's
    wrong-chunk start). LMCache's connector refuses it, the pod never turns Ready, and the operator's Prometheus fires
    the geometry alert on the probe's `wrong` verdict once its two minutes have passed."""
    options = PodOptions(FLASH, validation=False, values=VALUES)
    plans = with_chunk_size(render_plans(options), 256)
    name = loopback_pod_name(plans.serving)
    monitoring = chart_monitoring(pod_values(options), name)
    with running_pod(plans.serving, tmp_path / "pod", quiet, secret_values=plans.secrets) as pod:
        targets = scrape_targets(monitoring, pod.plan)
        with prometheus(monitoring.rules, targets, tmp_path / "prometheus") as server:

            def firing() -> Alert | None:
                return next((a for a in server.alerts() if a.name == GEOMETRY and a.state == "firing"), None)

            alert = server.wait_for(f"{GEOMETRY} firing", firing, GEOMETRY_FIRES_WITHIN_S)
            report = alert_report(server.alerts(), monitoring, 0.0)
    assert (alert.labels["pod"], alert.labels["status"], alert.labels["severity"]) == (name, "wrong", "critical")
    assert f"firing {GEOMETRY}: LMCache cache geometry on {name} does not match the model profile" in report
    assert "EngineCore failed to start" in (tmp_path / "pod" / "logs" / "vllm.log").read_text(errors="replace")
