"""glm53.testing.prometheus on its own: the targets and labels it reads from the chart, and each refusal in one line
(rules promtool refuses, a server that cannot start, a query that does not parse). The live pod's tests are in
test_prometheus_live.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from glm53.errors import Glm53Error
from glm53.pod import chart
from glm53.pod.main_job import PodOptions, merged, pod_values
from glm53.profiles import get_profile
from glm53.testing.prometheus import (
    MONITORING_VALUES,
    RUNBOOK_BASE_URL,
    ScrapeTarget,
    first_error,
    monitoring_of,
    prometheus,
    write_rules,
)

POD = "glm53-flash-6c9f7b5d8-q4x2z"
TARGET_LABELS = {"namespace": "default", "service": "glm53-flash", "job": "glm53-flash", "pod": POD}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The CPU pod's chart with the ServiceMonitor and the PrometheusRule on."""
    values = pod_values(PodOptions(get_profile("glm53-flash"), validation=False))
    return chart.render(merged(values, MONITORING_VALUES))


def test_the_service_monitors_ports_get_the_prometheus_operators_target_labels(rendered: list[dict[str, Any]]) -> None:
    monitoring = monitoring_of(rendered, POD)
    assert [(p.container, p.port, p.path, dict(p.labels)) for p in monitoring.ports] == [
        ("vllm", "http", "/metrics", {**TARGET_LABELS, "container": "vllm", "endpoint": "http"}),
        ("exporter", "metrics", "/metrics", {**TARGET_LABELS, "container": "exporter", "endpoint": "metrics"}),
    ]


def test_the_rules_are_the_rendered_prometheus_rules_spec(rendered: list[dict[str, Any]]) -> None:
    monitoring = monitoring_of(rendered, POD)
    rule = monitoring.rule("Glm53LMCacheUnreachable")
    assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE_URL}#glm53lmcacheunreachable"
    with pytest.raises(Glm53Error) as refused:
        monitoring.rule("Glm53Nothing")
    assert str(refused.value).startswith("the chart's PrometheusRule has no alert 'Glm53Nothing'; it has Glm53")


def test_a_service_monitor_port_that_reaches_no_container_is_one_line(rendered: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(rendered)
    service = next(o for o in broken if o["kind"] == "Service" and o["spec"].get("ports"))
    service["spec"]["ports"][0]["targetPort"] = "elsewhere"
    with pytest.raises(Glm53Error) as refused:
        monitoring_of(broken, POD)
    assert str(refused.value) == (
        "the ServiceMonitor's endpoint port 'http' reaches no named container port of the Deployment through the "
        "Service; check the Service's targetPort"
    )


def test_rules_promtool_refuses_are_its_first_error(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "rate(up[5m) > 0"}]}]}
    with pytest.raises(Glm53Error) as refused:
        write_rules(rules, tmp_path / "rules.yaml")
    assert str(refused.value) == (
        f'promtool refuses the rules in {tmp_path}/rules.yaml: {tmp_path}/rules.yaml: 5:11: group "g", rule 1, '
        '"A": could not parse expression: 1:11: parse error: unexpected ")" in subquery or range, expected ":" or "]"'
    )


def test_first_error_is_the_line_after_failed() -> None:
    assert first_error("Checking r.yaml\n  FAILED:\nr.yaml: yaml: bad\nr.yaml: yaml: bad\n") == "r.yaml: yaml: bad"
    assert first_error("something else\n") == "something else"
    assert first_error("") == "no message"


def test_a_prometheus_that_cannot_start_is_its_logs_last_line(tmp_path: Path) -> None:
    target = ScrapeTarget("http://127.0.0.1:9/metrics", {"not-a-label": "x"})
    with pytest.raises(Glm53Error) as refused, prometheus({"groups": []}, [target], tmp_path):
        pass
    message = str(refused.value)
    assert message.startswith("Prometheus did not start on 127.0.0.1:") and "\n" not in message
    assert 'msg="Error loading config' in message and '\\"not-a-label\\" is not a valid label name' in message


def test_a_query_prometheus_refuses_is_one_line(tmp_path: Path) -> None:
    with prometheus({"groups": []}, [], tmp_path) as server:
        assert server.query("1 + 1")[0]["value"][1] == "2"
        with pytest.raises(Glm53Error) as refused:
            server.query("sum(")
    assert str(refused.value) == (
        "Prometheus refused /api/v1/query {'query': 'sum('}: bad_data: invalid parameter \"query\": 1:5: parse error: "
        "unclosed left parenthesis"
    )
