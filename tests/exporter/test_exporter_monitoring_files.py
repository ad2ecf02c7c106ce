"""The alert rules and the Grafana dashboard: valid YAML/JSON, PromQL that a real parser accepts, and only metric names
that really exist: those the exporter serves (its own, and the LMCache families it passes through from the pages the
real `lmcache server` produced, without an L2 tier and with the L2 tiers of `fixtures/lmcache-l2-*.prom`) and those
vLLM 0.33 serves (the vLLM stand-in's registry, held to vLLM's real names), and in
the alerts Prometheus's own `up` for the exporter's scrape target."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest

from glm53.mock.vllm_metrics import VllmMetrics
from glm53.staging.metrics import sample_names as stage_sample_names
from tests.exporter.real_l2 import L2Pages
from tests.support.exporter_fakes import LMCACHE_PAGE, LMCACHE_URL, MODEL, VLLM_PAGE, VLLM_URL, copy_logs, wired

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "charts/glm53/files/glm53-alerts.yaml"
DASHBOARD = REPO / "charts/glm53/files/glm53-dashboard.json"
RUNBOOK = REPO / "docs/runbook.md"
# The chart embeds the alerts under a PrometheusRule's `spec:` with .Files.Get, so the file has no `---` start marker.
YAMLLINT_CONFIG = "{extends: default, rules: {line-length: {max: 120}, document-start: disable}}"
# Grafana fills these in before a query reaches Prometheus; any valid duration stands in for the parser.
GRAFANA_DURATIONS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
# The one series no page serves that an alert may read: Prometheus writes `up` for each target it scrapes (0 while the
# scrape fails), the only way to see the exporter itself down, since its own series then simply stop. Only for the
# exporter's target, as the Prometheus Operator labels the ServiceMonitor's `metrics` endpoint (its port's container).
PROMETHEUS_UP = "up"
EXPORTER_TARGET = {"endpoint": "metrics", "container": "exporter"}


def _sample_names(page: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in page.splitlines() if line and not line.startswith("#")}


@pytest.fixture(scope="module")
def known_metrics(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name the exporter serves when fed LMCache's real pages (without and with an L2 tier, healthy or
    failing: a failure counter appears with its first count) and vLLM's counters, plus vLLM's own names (the stand-in's
    registry, whose names a conformance test holds to vLLM 0.33's)."""
    vllm_names = _sample_names(generate_latest(VllmMetrics(MODEL, lambda: 0.0).registry).decode())
    exporter: set[str] = set()
    for lmcache_page in (LMCACHE_PAGE, *L2Pages.read().files().values()):
        pages = {VLLM_URL: VLLM_PAGE, LMCACHE_URL: lmcache_page}
        with wired(list(copy_logs(tmp_path_factory.mktemp("logs"))), pages) as (registry, _):
            exporter |= {sample.name for family in registry.collect() for sample in family.samples}
    # Sanity of the source: the log facts, the joined ratios and LMCache's passed-through families are all there.
    assert {"glm53_geometry_info", "glm53_prefix_cache_hit_ratio", "lmcache_mp_l1_usage_ratio"} <= exporter
    assert "lmcache_mp_l2_store_submitted_objects_chunks_total" in exporter
    return exporter | vllm_names


def _alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for expr in list(queries):
        for variable, duration in GRAFANA_DURATIONS.items():
            expr = expr.replace(variable, duration)
        queries.append(expr)
    return [q for q in queries if "$__" not in q]


def _metric_names(expr: str) -> set[str]:
    found: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"selector without a metric name in {expr!r}"
            found.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _equality_matchers(expr: str, name: str) -> list[dict[str, str]]:
    """The `label="value"` matchers of each selector of `name` in the expression."""
    found: list[dict[str, str]] = []

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name == name:
            matchers = node.matchers.matchers
            found.append({m.name: m.value for m in matchers if m.op == promql_parser.MatchOp.Equal})

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower-case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_alerts_file_passes_yamllint() -> None:
    command = [sys.executable, "-m", "yamllint", "--strict", "-f", "parsable", "-d", YAMLLINT_CONFIG, str(ALERTS)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_alerts_file_is_plain_yaml_without_helm_templating() -> None:
    text = ALERTS.read_text()
    assert "{{ ." not in text and "{{- " not in text and "{{ include" not in text
    assert set(yaml.safe_load(text)) == {"groups"}


def test_every_alert_has_summary_description_and_a_runbook_section() -> None:
    anchors = _anchors(RUNBOOK.read_text())
    rules = _alert_rules()
    assert {r["alert"] for r in rules} >= {
        "Glm53GeometryMismatch",
        "Glm53LMCacheUnreachable",
        "Glm53LMCacheRestarting",
        "Glm53ExternalHitRatioCollapsed",
        "Glm53LMCacheL2Failing",
        "Glm53ExporterScrapeFailing",
        "Glm53UpstreamScrapeErrors",
    }
    for rule in rules:
        annotations = rule["annotations"]
        assert annotations["summary"] and "Next step" in annotations["description"], rule["alert"]
        path, _, anchor = annotations["runbook_url"].partition("#")
        assert path == "docs/runbook.md" and anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, f"{rule['alert']}: no section '{anchor}' in docs/runbook.md"
        assert rule["labels"]["severity"] in {"critical", "warning"}


def test_alert_expressions_parse_and_use_only_real_metrics(known_metrics: set[str]) -> None:
    for rule in _alert_rules():
        names = _metric_names(rule["expr"])
        assert names, rule["alert"]
        unknown = names - known_metrics - {PROMETHEUS_UP}
        assert not unknown, f"{rule['alert']} uses unknown metrics {sorted(unknown)}"
        for matchers in _equality_matchers(rule["expr"], PROMETHEUS_UP):
            assert EXPORTER_TARGET.items() <= matchers.items(), (
                f"{rule['alert']} reads {PROMETHEUS_UP} beyond the exporter's target {EXPORTER_TARGET}: {matchers}"
            )


def test_dashboard_queries_parse_and_use_only_real_metrics(known_metrics: set[str]) -> None:
    """The exporter's series, and the weights' stage step's own (`glm53_stage_*`, served by that container)."""
    queries = _dashboard_queries()
    assert len(queries) >= 10
    served = known_metrics | stage_sample_names()
    for expr in queries:
        names = _metric_names(expr)
        assert names <= served, f"{expr!r} uses unknown metrics {sorted(names - served)}"


def test_dashboard_has_the_panels_an_operator_opens_first() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    pod_query = variables["pod"]["definition"]
    assert re.fullmatch(r"label_values\((\w+), pod\)", pod_query), pod_query
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}
    assert "glm53_geometry_matches_profile" in exprs["Geometry matches profile"]
    ratios = exprs["Prefix-cache hit ratios"]
    assert "glm53_prefix_cache_hit_tokens_total" in ratios and "glm53_strict_prefix_bound_tokens_total" in ratios
    assert 'scope="external"' in exprs["Tokens served from LMCache"]
    ttft = exprs["Time to first token"]
    assert "histogram_quantile(" in ttft and "vllm:time_to_first_token_seconds_bucket" in ttft
    assert "lmcache_mp_l1_memory_usage_bytes" in exprs["LMCache L1 memory"]
    l2 = exprs["LMCache L2 tier: stores and loads"]
    assert "lmcache_mp_l2_store_completed_objects_chunks_total" in l2
    assert "lmcache_mp_l2_prefetch_failure_chunks_total" in l2
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_pod_variable_reads_an_exporter_metric(known_metrics: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    pod = next(v for v in dashboard["templating"]["list"] if v["name"] == "pod")
    match = re.fullmatch(r"label_values\((\w+), pod\)", pod["definition"])
    assert match is not None and match.group(1) in known_metrics


def test_every_exporter_metric_is_in_the_runbook_reference(known_metrics: set[str]) -> None:
    reference = RUNBOOK.read_text().split("## Metric reference", 1)[1]
    documented = set(re.findall(r"^\| `(glm53_\w+)", reference, flags=re.MULTILINE))
    assert {name for name in known_metrics if name.startswith("glm53_")} == documented
