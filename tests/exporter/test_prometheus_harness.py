"""glm53.pod.prometheus on its own: the targets and labels it reads from the chart, and each refusal in one line
(rules promtool refuses, a server that cannot start, a query that does not parse). The live pod's tests are in
test_prometheus_live.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from glm53.errors import Glm53Error
from glm53.pod import chart
from glm53.pod.main_job import PodOptions, pod_values
from glm53.pod.prometheus import (
    MONITORING_VALUES,
    RUNBOOK_BASE_URL,
    AlertsSeen,
    ScrapeTarget,
    alert_report,
    alerts_of,
    first_error,
    monitoring_of,
    prometheus,
    write_rules,
)
from glm53.profiles import get_profile

POD = "glm53-flash-6c9f7b5d8-q4x2z"
TARGET_LABELS = {"namespace": "default", "service": "glm53-flash", "job": "glm53-flash", "pod": POD}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The CPU pod's chart with the ServiceMonitor and the PrometheusRule on."""
    values = pod_values(PodOptions(get_profile("glm53-flash"), validation=False))
    return chart.render(chart.merged(values, MONITORING_VALUES))


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


def test_the_alert_report_is_firing_first_and_says_what_a_pending_alert_waits_for(
    rendered: list[dict[str, Any]],
) -> None:
    monitoring = monitoring_of(rendered, POD)
    count = sum(1 for group in monitoring.rules["groups"] for rule in group["rules"] if "alert" in rule)
    assert alert_report([], monitoring, 41.6) == [
        f"none of the chart's {count} alerts active, pending or firing (the pod scraped and the rules evaluated "
        "every 1s for 42 s)"
    ]
    # What /api/v1/alerts answers (Prometheus 2.42's shape), the summaries filled in by the server.
    answer = {
        "alerts": [
            {
                "labels": {"alertname": "Glm53LMCacheUnreachable", "pod": POD},
                "annotations": {"summary": f"LMCache sidecar on {POD} is not answering its metrics endpoint"},
                "state": "pending",
                "activeAt": "2026-12-05T02:50:01.5Z",
            },
            {
                "labels": {"alertname": "Glm53LMCacheRestarting", "pod": POD},
                "annotations": {"summary": f"LMCache sidecar on {POD} restarted in the last 15 minutes"},
                "state": "firing",
                "activeAt": "2026-12-05T02:50:03Z",
            },
        ]
    }
    assert alert_report(alerts_of(answer), monitoring, 90.0) == [
        f"firing Glm53LMCacheRestarting: LMCache sidecar on {POD} restarted in the last 15 minutes",
        f"pending Glm53LMCacheUnreachable (fires once true for 2m): LMCache sidecar on {POD} is not answering its "
        "metrics endpoint",
    ]


def alert(name: str, state: str, active_at: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, "pod": POD}, "state": state, "activeAt": active_at}


def test_a_faults_alerts_are_what_it_raised_with_their_furthest_state_and_what_was_active_before_apart() -> None:
    restarting_before = alert("Glm53LMCacheRestarting", "firing", "2026-12-05T02:40:00Z")
    seen = AlertsSeen.starting(alerts_of({"alerts": [restarting_before]}))
    unreachable = alert("Glm53LMCacheUnreachable", "pending", "2026-12-05T02:50:01Z")
    restarting_again = alert("Glm53LMCacheRestarting", "firing", "2026-12-05T02:50:40Z")
    seen.add(alerts_of({"alerts": [restarting_before, unreachable]}))
    seen.add(alerts_of({"alerts": [{**unreachable, "state": "firing"}]}))
    seen.add(alerts_of({"alerts": [unreachable]}))  # never back from firing to pending
    assert seen.describe(alerts_of({"alerts": [restarting_again]})) == (
        "Glm53LMCacheRestarting firing, still active; Glm53LMCacheUnreachable firing, cleared; "
        "already active: Glm53LMCacheRestarting"
    )
    assert AlertsSeen.starting([]).describe([]) == "none"


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
