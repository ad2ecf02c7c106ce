"""The router component (`router.enabled`): vllm-router in front of the engine pods.

The rendered router command line is parsed by the REAL vllm-router 0.1.17 parser (`parse_router_args`), so a flag the
router does not know, or a value it rejects, fails here and not in a cluster.
"""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from vllm_router.launch_router import parse_router_args
from vllm_router.router_args import RouterArgs

from tests.support.chartkit import (
    NAMESPACE,
    NEWEST_KUBE,
    OLDEST_KUBE,
    RELEASE,
    Obj,
    engine_workload,
    get,
    notes,
    objects,
    render,
    render_cli,
    scenario_values,
)

ROUTER = f"{RELEASE}-router"


def _named(objs: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects(objs, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _component(obj: Obj) -> str:
    component: str = obj["metadata"]["labels"]["app.kubernetes.io/component"]
    return component


def _engine(objs: list[Obj]) -> Obj:
    """The engine workload: a StatefulSet in the router scenarios (newPvc with replicaCount > 1), else a Deployment."""
    workload = engine_workload(objs)
    assert workload["metadata"]["name"] == RELEASE
    return workload


def _router_container(objs: list[Obj]) -> Obj:
    container: Obj = get(_named(objs, "Deployment", ROUTER), "spec.template.spec.containers[name=router]")
    return container


def _parsed(objs: list[Obj]) -> RouterArgs:
    args = _router_container(objs)["args"]
    parsed = parse_router_args(args)
    parsed._validate_router_args()  # what `vllm-router` runs before starting the Rust router
    return parsed


def _pod_templates(objs: list[Obj]) -> list[dict[str, Any]]:
    """Labels of every pod the chart can create: Deployment and StatefulSet templates and bare Pods (`helm test`)."""
    workloads = objects(objs, "Deployment") + objects(objs, "StatefulSet")
    labels = [get(d, "spec.template.metadata.labels") for d in workloads]
    return labels + [p["metadata"]["labels"] for p in objects(objs, "Pod")]


@pytest.fixture(scope="module")
def router_objs() -> list[Obj]:
    return render(scenario_values("router"))


def test_router_disabled_renders_the_chart_without_it() -> None:
    default = render({})
    assert render({"router": {"enabled": False}}) == default
    # Replicas alone change only the engine workload (and, newPvc needing a claim per replica, its storage).
    assert render({"replicaCount": 3}) != default
    for objs in (default, render({"replicaCount": 3})):
        assert [o for o in objs if _component(o) == "router"] == []


def test_the_real_router_parser_accepts_the_rendered_command_line(router_objs: list[Obj]) -> None:
    parsed = _parsed(router_objs)
    assert parsed.policy == "cache_aware"
    assert (parsed.host, parsed.port) == ("0.0.0.0", 8000)
    assert parsed.service_discovery is True
    assert parsed.service_discovery_port == 8000  # the engine's API port
    assert parsed.service_discovery_namespace == NAMESPACE
    assert parsed.worker_urls == []
    # vllm_router/router_args.py:99: GET /health, the endpoint vLLM answers 503 on when its engine died.
    assert parsed.health_check_endpoint == "/health"
    assert (parsed.health_check_interval_secs, parsed.health_failure_threshold) == (10, 3)
    assert parsed.prometheus_port == 29000
    assert "command" not in _router_container(router_objs)  # the image's entrypoint: tini -- vllm-router
    assert get(_named(router_objs, "Deployment", ROUTER), "spec.replicas") == 1
    assert get(_engine(router_objs), "spec.replicas") == 3


def test_the_selector_matches_the_engine_pods_and_nothing_else(router_objs: list[Obj]) -> None:
    selector = _parsed(router_objs).selector
    assert selector == get(_named(router_objs, "Service", RELEASE), "spec.selector")
    # Validation across replicas must name one pod (the chart refuses it through the Service).
    one_pod = {"enabled": True, "baseUrl": "http://10.0.0.11:8000"}
    validation = render({**scenario_values("router"), "validation": one_pod})
    templates = _pod_templates(validation)
    assert len(templates) == 3  # engine, router, helm-test pod
    matching = [labels for labels in templates if selector.items() <= labels.items()]
    assert matching == [get(_engine(validation), "spec.template.metadata.labels")]
    # Another release's engines in the same namespace differ in the instance label.
    assert selector["app.kubernetes.io/instance"] == RELEASE


def test_rbac_is_read_only_on_pods_in_the_release_namespace(router_objs: list[Obj]) -> None:
    assert objects(router_objs, "ClusterRole") == [] and objects(router_objs, "ClusterRoleBinding") == []
    role = _named(router_objs, "Role", ROUTER)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = _named(router_objs, "RoleBinding", ROUTER)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ROUTER, "namespace": NAMESPACE}]
    spec = get(_named(router_objs, "Deployment", ROUTER), "spec.template.spec")
    assert spec["serviceAccountName"] == ROUTER
    assert spec["automountServiceAccountToken"] is True  # it talks to the API server; nothing else in the chart does
    assert get(_engine(router_objs), "spec.template.spec.automountServiceAccountToken") is False


def test_the_router_pod_is_non_root_with_probes_and_resources(router_objs: list[Obj]) -> None:
    container = _router_container(router_objs)
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True and context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert get(container, "livenessProbe.httpGet.path") == "/liveness"
    assert get(container, "readinessProbe.httpGet.path") == "/readiness"
    assert set(container["resources"]) == {"requests", "limits"}
    service = _named(router_objs, "Service", ROUTER)
    assert get(service, "spec.selector") == get(_named(router_objs, "Deployment", ROUTER), "spec.selector.matchLabels")
    assert get(service, "spec.ports[name=http].targetPort") == "http"


def test_network_policy_admits_the_engine_api_from_the_router_only(router_objs: list[Obj]) -> None:
    policy = _named(router_objs, "NetworkPolicy", f"{ROUTER}-to-engine")
    assert get(policy, "spec.podSelector.matchLabels") == _parsed(router_objs).selector
    [rule] = get(policy, "spec.ingress")
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    router_labels = get(_named(router_objs, "Deployment", ROUTER), "spec.selector.matchLabels")
    assert rule["from"] == [{"podSelector": {"matchLabels": router_labels}}]


def test_kv_aware_feeds_the_profile_block_size_and_admits_events_from_the_router_only() -> None:
    objs = render(scenario_values("router-kvaware"))
    parsed = _parsed(objs)
    assert parsed.policy == "kv_aware"
    assert parsed.kv_event_block_size == 64  # GLM-5.3's single 64-token group
    assert parsed.kv_event_model == "zai-org/GLM-5.3"
    assert parsed.kv_event_source == [
        "http://10.0.0.11:8000=tcp://10.0.0.11:5557",
        "http://10.0.0.12:8000=tcp://10.0.0.12:5557",
    ]
    [rule] = get(_named(objs, "NetworkPolicy", f"{ROUTER}-to-engine"), "spec.ingress")
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}, {"port": 5557, "protocol": "TCP"}]
    assert list(rule["from"][0]) == ["podSelector"]
    # The engines' own policy never admits the events port.
    engine_ports = [p["port"] for r in get(_named(objs, "NetworkPolicy", RELEASE), "spec.ingress") for p in r["ports"]]
    assert 5557 not in engine_ports
    # GLM-5.3-Flash publishes per unified 1152-token block.
    flash = render({"replicaCount": 2, "router": {"enabled": True, "policy": "kv_aware"}})
    assert _parsed(flash).kv_event_block_size == 1152


def test_kv_aware_engines_publish_kv_events() -> None:
    vllm = get(_engine(render(scenario_values("router-kvaware"))), "spec.template.spec.containers[name=vllm]")
    args = vllm["args"]
    events = json.loads(args[args.index("--kv-events-config") + 1])
    # vllm/config/kv_events.py: enable_kv_cache_events, publisher "zmq", endpoint (bind form tcp://*:PORT), topic.
    assert events == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": "",  # vllm-router 0.1.17 static sources subscribe to "" exactly (src/kv_index/subscriber.rs:179-186)
    }
    for values in ({}, scenario_values("router")):  # no router, or cache_aware: no publisher on the engines
        engine = get(_engine(render(values)), "spec.template.spec.containers[name=vllm]")
        assert "--kv-events-config" not in engine["args"]


def test_engines_behind_a_router_serve_the_render_routes() -> None:
    """vllm-router tokenizes through /v1/completions/render, which vLLM 0.33 serves only with --enable-scale-out
    (vllm/entrypoints/scale_out/factories.py:94-129); without a router the engines keep those routes closed."""
    for values, expected in ((scenario_values("router"), True), (scenario_values("router-kvaware"), True), ({}, False)):
        engine = get(_engine(render(values)), "spec.template.spec.containers[name=vllm]")
        assert ("--enable-scale-out" in engine["args"]) is expected, values


@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
@pytest.mark.parametrize("scenario", ["router", "router-kvaware"])
def test_router_objects_pass_kubernetes_schemas(scenario: str, kube_version: str) -> None:
    objs = render_cli(scenario_values(scenario), kube_version)
    routed = [o for o in objs if _component(o) == "router"]
    assert sorted(o["kind"] for o in routed) == [
        "Deployment",
        "NetworkPolicy",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {kube_version}: {error}")


def test_notes_point_at_the_router_service() -> None:
    text = notes(scenario_values("router"))
    assert f"port-forward svc/{ROUTER} 8000:8000" in text
    assert "cache_aware over 3 engine pods" in text
    unbound = notes({"replicaCount": 2, "router": {"enabled": True, "policy": "kv_aware"}})
    assert "kv_aware without router.kvAware.eventSources" in unbound
    assert "WARNING: kv_aware on the hybrid GLM-5.3-Flash: vLLM publishes events only for full 1152-token" in unbound
    assert "kv_aware on the hybrid" not in notes(scenario_values("router-kvaware"))  # GLM-5.3: one 64-token group
