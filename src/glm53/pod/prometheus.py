"""A real Prometheus on loopback that scrapes a running CPU pod as the chart's ServiceMonitor would and evaluates the
chart's alerts as its PrometheusRule ships them: what an operator's Prometheus would see of the pod, and say about it.
`glm53 pod --prometheus` prints what it says after the main job; the tests evaluate every alert and panel with it.

The server is Debian bookworm's `prometheus` 2.42.0 (scripts/setup.d/33-promtool.sh puts it, and promtool, on the
repository's .tools/bin). Its rules file is the `spec` of the PrometheusRule the chart renders (Helm's engine
in-process, `glm53.pod.chart`), not the chart's alerts file: the render is what the Prometheus Operator loads (the
runbook links rewritten under `monitoring.prometheusRule.runbookBaseUrl`). promtool checks the file first, so a rule
Prometheus would refuse is one line, not a server that silently evaluates nothing.

Labels. In a cluster the Prometheus Operator discovers the ServiceMonitor's endpoints and relabels each target
(prometheus-operator v0.93 pkg/prometheus/promcfg.go:2118-2149, 2176-2205, generateServiceMonitorConfig): `namespace`
(the Service's namespace), `service` (its name), `pod` and `container` (the pod and the container owning the port),
`job` (the Service's name, the ServiceMonitor having no jobLabel) and `endpoint` (the endpoint's `port`, the Service
port's name); `instance` stays Prometheus's default, the address scraped. Every alert groups or joins `by (namespace,
pod)` and Glm53ExporterScrapeFailing selects `up{endpoint="metrics", container="exporter"}`, so a loopback scrape
without them would make the rules evaluate to nothing. Here they are static labels of each target, derived from the
same render (the ServiceMonitor, the Service it selects and the Deployment's containers); only `pod` is the caller's,
since Kubernetes names the pod. The ServiceMonitor sets no honorLabels, so a page's own label of one of these names
would be renamed `exported_<name>`, as in a cluster.

Timing is the test's, not the chart's: every target scraped and every rule evaluated each second (the chart scrapes
every 30 s and the Operator evaluates every 30 s), so a test sees a change within seconds; the rules' own `for:` and
ranges are untouched. Prometheus applies its targets on its scrape manager's first reload tick, about 5 s after start,
so `wait_scraped` is the first thing to wait for.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

from glm53.errors import Glm53Error
from glm53.pod import chart
from glm53.pod.loopback import LOCALHOST, ContainerProcess, free_ports, stop_all
from glm53.pod.plan import PodPlan

# The repository's tool folder, searched after PATH (this file is src/glm53/pod/prometheus.py).
TOOLS_BIN = Path(__file__).resolve().parents[3] / ".tools" / "bin"
SETUP_SCRIPT = "scripts/setup.d/33-promtool.sh"
# The chart refuses a PrometheusRule without an absolute runbook base (its guard); alerts only carry the link.
RUNBOOK_BASE_URL = "https://runbook.invalid/glm53"
# What turns the chart's monitoring objects on, layered over the pod's own values.
MONITORING_VALUES = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "runbookBaseUrl": RUNBOOK_BASE_URL},
    }
}
INTERVAL = "1s"
START_DEADLINE_S = 30.0
STOP_GRACE_S = 10.0
HTTP_TIMEOUT_S = 10.0
POLL_S = 0.25

T = TypeVar("T")


# --- the chart: rules and what the ServiceMonitor scrapes (pure) -------------------------------------------------


@dataclass(frozen=True)
class MonitoredPort:
    """One endpoint of the chart's ServiceMonitor resolved to the pod: the container and its port's name, the path,
    and the labels the Prometheus Operator gives the target."""

    container: str
    port: str
    path: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class ChartMonitoring:
    """What the chart renders for Prometheus: the PrometheusRule's `spec` (a rules file's `groups`) and the ports its
    ServiceMonitor scrapes."""

    rules: Mapping[str, Any]
    ports: tuple[MonitoredPort, ...]

    def rule(self, alert: str) -> Mapping[str, Any]:
        """The rule of `alert`, or an error naming the alerts there are."""
        rules: dict[str, Mapping[str, Any]] = {
            r["alert"]: r for group in self.rules["groups"] for r in group["rules"] if "alert" in r
        }
        if alert not in rules:
            raise Glm53Error(f"the chart's PrometheusRule has no alert {alert!r}; it has {', '.join(sorted(rules))}")
        return rules[alert]


def _one(objects: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    found = [o for o in objects if o.get("kind") == kind]
    if len(found) != 1:
        raise Glm53Error(f"expected one {kind} in the rendered chart, found {len(found)}; check the monitoring values")
    return found[0]


def monitoring_of(objects: Sequence[Mapping[str, Any]], pod: str) -> ChartMonitoring:
    """The rules and the scraped ports of a render with monitoring on, for a pod of the Deployment named `pod`."""
    monitor = _one(objects, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [
        o for o in objects if o.get("kind") == "Service" and selector.items() <= o["metadata"]["labels"].items()
    ]
    if len(services) != 1:
        raise Glm53Error(f"the chart's ServiceMonitor selects {len(services)} Services, expected one")
    service = services[0]
    containers = _one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    ports = []
    for endpoint in monitor["spec"]["endpoints"]:
        target = next((p["targetPort"] for p in service["spec"]["ports"] if p["name"] == endpoint["port"]), None)
        owner = next((c["name"] for c in containers for p in c.get("ports", []) if p["name"] == target), None)
        if owner is None:
            raise Glm53Error(
                f"the ServiceMonitor's endpoint port {endpoint['port']!r} reaches no named container port of the "
                "Deployment through the Service; check the Service's targetPort"
            )
        labels = {
            "namespace": service["metadata"]["namespace"],
            "service": service["metadata"]["name"],
            "job": service["metadata"]["name"],
            "pod": pod,
            "container": owner,
            "endpoint": endpoint["port"],
        }
        ports.append(MonitoredPort(owner, str(target), endpoint.get("path", "/metrics"), labels))
    return ChartMonitoring(_one(objects, "PrometheusRule")["spec"], tuple(ports))


def loopback_pod_name(plan: PodPlan) -> str:
    """The `pod` label of a pod run on loopback: its Deployment's name and `-loopback`, where Kubernetes would add a
    ReplicaSet hash and a suffix."""
    return f"{plan.name}-loopback"


def chart_monitoring(values: Mapping[str, Any], pod: str) -> ChartMonitoring:
    """The chart rendered with the pod's `values` and its ServiceMonitor and PrometheusRule on."""
    return monitoring_of(chart.render(chart.merged(values, MONITORING_VALUES)), pod)


@dataclass(frozen=True)
class ScrapeTarget:
    """One URL Prometheus scrapes and the static labels of its target."""

    url: str
    labels: Mapping[str, str]


def scrape_targets(monitoring: ChartMonitoring, plan: PodPlan) -> tuple[ScrapeTarget, ...]:
    """The ServiceMonitor's ports on a pod running on loopback (a relocated `plan`: its ports are the moved ones)."""
    return tuple(
        ScrapeTarget(f"http://{LOCALHOST}:{plan.container(p.container).port(p.port)}{p.path}", p.labels)
        for p in monitoring.ports
    )


def prometheus_config(targets: Sequence[ScrapeTarget], rules_file: Path) -> dict[str, Any]:
    """Prometheus's configuration: one scrape job per target (each may have its own path), scraped and evaluated
    every `INTERVAL` (the scrape timeout follows the interval when it is under the 10 s default)."""
    jobs = []
    for index, target in enumerate(targets):
        url = urllib.parse.urlsplit(target.url)
        jobs.append(
            {
                "job_name": f"target-{index}",
                "metrics_path": url.path,
                "static_configs": [{"targets": [url.netloc], "labels": dict(target.labels)}],
            }
        )
    return {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(rules_file)],
        "scrape_configs": jobs,
    }


def first_error(promtool_output: str) -> str:
    """promtool's first complaint: the first line after its `FAILED:` heading (the whole output when there is none)."""
    lines = [line.strip() for line in promtool_output.splitlines() if line.strip()]
    after = lines[lines.index("FAILED:") + 1 :] if "FAILED:" in lines else lines
    return after[0] if after else "no message"


# --- what the HTTP API answers (pure) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Alert:
    """An alert Prometheus holds active: pending (its expression is true, for less than its `for:`) or firing."""

    name: str
    state: str
    labels: Mapping[str, str]
    active_at: datetime
    summary: str = ""  # its `summary` annotation, with the alert's labels filled in


def alerts_of(data: Mapping[str, Any]) -> list[Alert]:
    """The alerts of an /api/v1/alerts answer's `data`."""
    return [
        Alert(
            a["labels"]["alertname"],
            a["state"],
            a["labels"],
            datetime.fromisoformat(a["activeAt"]),
            a.get("annotations", {}).get("summary", ""),
        )
        for a in data["alerts"]
    ]


def alert_report(alerts: Sequence[Alert], monitoring: ChartMonitoring, watched_s: float) -> list[str]:
    """What an operator's Prometheus says of the pod, a line per active alert (firing first), or one line saying none
    of the chart's alerts is active. A pending alert says the `for:` it must hold before it fires."""
    rules = [r for group in monitoring.rules["groups"] for r in group["rules"] if "alert" in r]
    if not alerts:
        return [
            f"none of the chart's {len(rules)} alerts active, pending or firing (the pod scraped and the rules "
            f"evaluated every {INTERVAL} for {watched_s:.0f} s)"
        ]
    lines = []
    for alert in sorted(alerts, key=lambda a: (a.state != "firing", a.name)):
        wait = ""
        if alert.state == "pending":
            wait = f" (fires once true for {monitoring.rule(alert.name).get('for', '0s')})"
        lines.append(f"{alert.state} {alert.name}{wait}: {alert.summary or 'no summary'}")
    return lines


@dataclass
class AlertsSeen:
    """The alerts a fault raised: each that became active after the fault began, with the furthest state it reached
    (firing over pending). Those already active then (`before`, by name and activation) are named apart: a restart's
    alert reads 15 minutes and outlasts the next fault's start."""

    before: frozenset[tuple[str, datetime]]
    reached: dict[str, str] = field(default_factory=dict)

    @classmethod
    def starting(cls, active: Sequence[Alert]) -> AlertsSeen:
        return cls(frozenset((a.name, a.active_at) for a in active))

    def add(self, active: Sequence[Alert]) -> None:
        for alert in active:
            if (alert.name, alert.active_at) not in self.before and self.reached.get(alert.name) != "firing":
                self.reached[alert.name] = alert.state

    def describe(self, active_at_end: Sequence[Alert]) -> str:
        """One cell: `Name state, cleared|still active` per alert raised (`none` if the fault raised none), then the
        alerts that were already active."""
        self.add(active_at_end)
        still = {a.name for a in active_at_end}
        parts = [
            f"{name} {state}, {'still active' if name in still else 'cleared'}"
            for name, state in sorted(self.reached.items())
        ] or ["none"]
        already = sorted({name for name, _ in self.before})
        return "; ".join(parts + ([f"already active: {', '.join(already)}"] if already else []))


def last_evaluations(data: Mapping[str, Any]) -> list[datetime]:
    """When each rule group of an /api/v1/rules answer's `data` was last evaluated (year 1 if never)."""
    return [datetime.fromisoformat(group["lastEvaluation"]) for group in data["groups"]]


# --- the server (I/O) ---------------------------------------------------------------------------------------------


def find_tool(name: str) -> str:
    """`name` on PATH or in the repository's .tools/bin, or an error naming the script that installs it."""
    found = shutil.which(name) or shutil.which(name, path=str(TOOLS_BIN))
    if found is None:
        raise Glm53Error(f"{name} not found on PATH or in .tools/bin; run `bash {SETUP_SCRIPT}`")
    return found


def write_rules(rules: Mapping[str, Any], path: Path) -> None:
    """`rules` as a rules file, refused in one line (promtool's first error) when Prometheus would not load it."""
    path.write_text(yaml.safe_dump(json.loads(json.dumps(rules)), sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [find_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise Glm53Error(f"promtool refuses the rules in {path}: {first_error(done.stderr + done.stdout)}")


@dataclass(frozen=True)
class Prometheus:
    """A running server: its base URL, its log, and its process."""

    url: str
    log: Path
    process: ContainerProcess

    def api(self, path: str, **params: str) -> Any:
        """The `data` of an HTTP API answer; a refusal (a query that does not parse) is one line."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=HTTP_TIMEOUT_S) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as error:
            answer = json.load(error) if error.headers.get_content_type() == "application/json" else {}
            if "error" not in answer:
                raise Glm53Error(f"Prometheus answered {path} with HTTP {error.code}; see {self.log}") from None
        except (OSError, ValueError) as error:
            raise Glm53Error(f"Prometheus at {self.url} did not answer {path} ({error}); see {self.log}") from None
        if answer.get("status") != "success":
            raise Glm53Error(f"Prometheus refused {path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series, each with its `metric` labels and its `value` [time, "number"] (a range
        selector's with `values`; a scalar is one series without labels)."""
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[Alert]:
        """Every alert active now, pending or firing."""
        return alerts_of(self.api("/api/v1/alerts"))

    def wait_for(self, what: str, check: Callable[[], T | None], timeout_s: float) -> T:
        """`check`'s first answer that is not None (or False), polled; an error saying `what` was awaited."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.process.poll() is not None:
                raise Glm53Error(f"Prometheus exited while waiting for {what}: {last_line(self.log)}")
            found = check()
            if found is not None and found is not False:
                return found
            if time.monotonic() > deadline:
                raise Glm53Error(f"Prometheus did not see {what} within {timeout_s:g} s; see {self.log}")
            time.sleep(POLL_S)

    def wait_scraped(self, since: float, timeout_s: float = 30.0) -> None:
        """Until every target answered a scrape that began after `since` (a Unix time)."""

        def scraped() -> bool:
            targets = self.api("/api/v1/targets", state="active")["activeTargets"]
            return bool(targets) and all(
                t["health"] == "up" and datetime.fromisoformat(t["lastScrape"]).timestamp() > since for t in targets
            )

        self.wait_for(f"every target scraped after {since:.1f}", scraped, timeout_s)

    def wait_evaluated(self, since: float, timeout_s: float = 30.0) -> None:
        """Until every rule group was evaluated after `since` (a Unix time)."""

        def evaluated() -> bool:
            return all(at.timestamp() > since for at in last_evaluations(self.api("/api/v1/rules")))

        self.wait_for(f"every rule group evaluated after {since:.1f}", evaluated, timeout_s)

    def wait_settled(self, timeout_s: float = 30.0) -> None:
        """Until the rules were evaluated on scrapes that all began after now: what the alerts say then is about the
        pod as it is now."""
        now = time.time()
        self.wait_scraped(now, timeout_s)
        self.wait_evaluated(time.time(), timeout_s)


def last_line(log: Path) -> str:
    lines = log.read_text(encoding="utf-8", errors="replace").strip().splitlines() if log.exists() else []
    return lines[-1] if lines else "(its log is empty)"


@contextlib.contextmanager
def prometheus(rules: Mapping[str, Any], targets: Sequence[ScrapeTarget], workdir: Path) -> Iterator[Prometheus]:
    """A fresh Prometheus on a free loopback port scraping `targets` and evaluating `rules`; stopped on leaving.

    A server that exits or does not become ready is one line: the last line of its log."""
    program = find_tool("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    rules_file = workdir / "rules.yaml"
    write_rules(rules, rules_file)
    config = workdir / "prometheus.yaml"
    config.write_text(yaml.safe_dump(prometheus_config(targets, rules_file), sort_keys=False), encoding="utf-8")
    address = f"{LOCALHOST}:{free_ports(1)[0]}"
    command = [
        program,
        f"--config.file={config}",
        f"--web.listen-address={address}",
        f"--storage.tsdb.path={workdir / 'data'}",
    ]
    log = workdir / "prometheus.log"
    process = ContainerProcess("prometheus", command, {"PATH": os.environ.get("PATH", "")}, log)
    server = Prometheus(f"http://{address}", log, process)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not _ready(server.url):
            if process.process.poll() is not None or time.monotonic() > deadline:
                raise Glm53Error(f"Prometheus did not start on {address}: {last_line(log)}")
            time.sleep(POLL_S)
        yield server
    finally:
        stop_all([process], STOP_GRACE_S)


@contextlib.contextmanager
def watching(monitoring: ChartMonitoring | None, plan: PodPlan, workdir: Path) -> Iterator[Prometheus | None]:
    """With `monitoring`, a Prometheus scraping the running pod of `plan` as the chart's ServiceMonitor would and
    evaluating the chart's rules, once it scraped every target; without, None (nobody watches)."""
    if monitoring is None:
        yield None
        return
    with prometheus(monitoring.rules, scrape_targets(monitoring, plan), workdir) as server:
        server.wait_scraped(time.time())
        yield server


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=HTTP_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False
