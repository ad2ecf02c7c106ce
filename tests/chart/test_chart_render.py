"""Every CI scenario renders the same with Helm 4 (helm-python-sdk) and Helm 3 (CLI), lints strictly, and every
built-in object passes Kubernetes' own schemas (strict) for the oldest and newest supported versions."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.support.chartkit import (
    CRD_KINDS,
    NEWER_KUBE_RENDERS,
    NEWEST_KUBE,
    OLDEST_KUBE,
    Obj,
    RenderError,
    lint_cli,
    lint_sdk,
    render,
    render_cli,
    scenario_values,
    scenarios,
)

SCENARIOS = scenarios()


def _ids(objs: list[Obj]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objs)


def test_every_expected_scenario_exists() -> None:
    expected = {"default", "glm53", "mock", "mock-glm53", "monitoring", "validation", "existing-pvc", "hostpath"}
    assert expected <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm3_cli_and_helm4_sdk_render_the_same_objects(scenario: str) -> None:
    values = scenario_values(scenario)
    sdk = render(values)
    cli = render_cli(values)
    assert _ids(sdk) == _ids(cli)
    assert sorted(sdk, key=repr) == sorted(cli, key=repr)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict_passes_with_both_engines(scenario: str) -> None:
    values = scenario_values(scenario)
    assert "0 chart(s) failed" in lint_cli(values)
    report = lint_sdk(values)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _validate_strictly(objs: list[Obj], kube_version: str) -> int:
    checked = 0
    for obj in objs:
        if obj["kind"] in CRD_KINDS:
            continue  # Prometheus Operator CRDs: no schema offline; their shape is asserted in test_chart_pod.py
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {kube_version}: {error}")
        checked += 1
    return checked


@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_objects_pass_kubernetes_schemas_strictly(scenario: str, kube_version: str) -> None:
    checked = _validate_strictly(render_cli(scenario_values(scenario), kube_version), kube_version)
    assert checked >= 4  # Deployment, Service, ServiceAccount, NetworkPolicy at least


@pytest.mark.parametrize("kube_version", ["oldest", NEWEST_KUBE])
@pytest.mark.parametrize("name", sorted(NEWER_KUBE_RENDERS))
def test_newer_kubernetes_renders_pass_their_schemas_strictly(name: str, kube_version: str) -> None:
    """The DRA render (resource.k8s.io/v1 is GA from 1.34) against the 1.34 and the newest schemas."""
    values, oldest = NEWER_KUBE_RENDERS[name]
    version = oldest if kube_version == "oldest" else kube_version
    objs = render_cli(values, version)
    assert sorted(render(values), key=repr) == sorted(render_cli(values, NEWEST_KUBE), key=repr)
    assert _validate_strictly(objs, version) >= 5


def test_the_chart_refuses_kubernetes_older_than_1_29() -> None:
    with pytest.raises(RenderError, match=r"requires kubeVersion: >=1\.29"):
        render_cli({}, "1.28.0")
