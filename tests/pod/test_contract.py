"""The chart's names as `glm53.pod.contract` states them are the names the chart renders and its schema accepts.

The runners, the kind smoke test and the tests find containers, sidecars and components by these names; if the chart
renamed one, this fails first, naming it, instead of a runner failing later to find a container.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from glm53.pod import chart
from glm53.pod.contract import (
    CHART_NAME,
    CHECKOUT_CHART,
    COMPONENT_LABEL,
    DEFAULT_LMCACHE_GENERATION,
    DEFAULT_RELEASE,
    ENGINE_COMPONENT,
    ENGINE_CONTAINER,
    ENGINES,
    EXPORTER_CONTAINER,
    INSTANCE_LABEL,
    LMCACHE_GENERATIONS,
    SIDECAR_CONTAINER,
    VALIDATE_CONTAINER,
    is_lmcache_sidecar,
)
from glm53.pod.plan import deployment_pod, helm_test_pods

MOCK = {"mock": {"enabled": True}, "exporter": {"enabled": True}, "validation": {"enabled": True}}


def _schema_enum(*path: str) -> tuple[Any, ...]:
    node = json.loads((CHECKOUT_CHART / "values.schema.json").read_text())
    for key in path:
        node = node["properties"][key]
    return tuple(node["enum"])


def test_the_chart_and_the_values_it_accepts_are_the_contracts() -> None:
    values = yaml.safe_load((CHECKOUT_CHART / "values.yaml").read_text())
    assert yaml.safe_load((CHECKOUT_CHART / "Chart.yaml").read_text())["name"] == CHART_NAME
    assert _schema_enum("lmcache", "generation") == LMCACHE_GENERATIONS
    assert values["lmcache"]["generation"] == DEFAULT_LMCACHE_GENERATION
    assert sorted(_schema_enum("mock", "engine")) == sorted(ENGINES)


def test_the_rendered_pods_carry_the_contracts_container_names_and_labels() -> None:
    rendered = chart.render(MOCK)
    pod = deployment_pod(rendered)
    names = [c.name for c in pod.containers]
    assert {ENGINE_CONTAINER, SIDECAR_CONTAINER, EXPORTER_CONTAINER} <= set(names)
    assert [c.name for c in pod.lmcache_servers()] == [SIDECAR_CONTAINER]
    (engine,) = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"] == DEFAULT_RELEASE]
    selector = engine["spec"]["selector"]["matchLabels"]
    assert (selector[INSTANCE_LABEL], selector[COMPONENT_LABEL]) == (DEFAULT_RELEASE, ENGINE_COMPONENT)
    (test_pod,) = helm_test_pods(rendered)
    assert [c.name for c in test_pod.containers] == [VALIDATE_CONTAINER]


def test_per_rank_sidecars_are_recognised_by_the_contracts_naming() -> None:
    pod = deployment_pod(chart.render({**MOCK, "lmcache": {"serverLayout": "perRank"}}))
    sidecars = [c.name for c in pod.containers if c.sidecar and c.name != "make-model"]
    assert sidecars and all(is_lmcache_sidecar(name) for name in sidecars)
    assert [c.name for c in pod.lmcache_servers()] == sidecars
    assert not is_lmcache_sidecar(ENGINE_CONTAINER) and not is_lmcache_sidecar(f"{SIDECAR_CONTAINER}-x")
