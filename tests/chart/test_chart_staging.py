"""The stage step in the rendered pod (weights.staging, templates/staging/): the weights are staged before
the engine starts, the engine runs offline with a startup budget for the load alone, and every volume the chart can
mount (one claim, a claim per StatefulSet replica, a node directory, an emptyDir) is the one staged; a pre-staged
read-only claim skips staging. Asserted on rendered objects from Helm 4 (helm-python-sdk) and, where users' Helm
matters, the Helm 3 CLI.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from glm53.commands.stage_weights import build_parser
from tests.support.chartkit import (
    OLDEST_KUBE,
    RenderError,
    assert_refused,
    container,
    engine_workload,
    flag_value,
    get,
    objects,
    pod_spec,
    render,
    render_cli,
    scenario_values,
)

STAGE = "stage-weights"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
STATUS = ["glm53", "stage-weights", "status", "--status-file", "/var/log/glm53/stage/status.json"]


def init_names(values: dict[str, Any]) -> list[str]:
    return [c["name"] for c in pod_spec(render(values)).get("initContainers", [])]


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def stage_args(values: dict[str, Any]) -> list[str]:
    stage = container(render(values), STAGE)
    assert stage["command"] == ["/usr/bin/tini", "--", "glm53", "stage-weights", "run"]
    args: list[str] = stage["args"]
    return args


def test_default_pod_stages_first_then_the_sidecar_then_the_offline_engine() -> None:
    objs = render({})
    spec = pod_spec(objs)
    assert [c["name"] for c in spec["initContainers"]] == [STAGE, "lmcache"]
    stage = spec["initContainers"][0]
    # A native sidecar: the kubelet starts the next container only once its startup probe passed.
    assert stage["restartPolicy"] == "Always"
    assert get(stage, "startupProbe.exec.command") == STATUS
    assert get(stage, "startupProbe.periodSeconds") * get(stage, "startupProbe.failureThreshold") == 24 * 3600
    assert stage["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert stage["args"] == [
        "--repo", "zai-org/GLM-5.3-Flash", "--revision", "main", "--cache-dir", "/models/huggingface/hub",
        "--max-workers", "8", "--reverify", "sizes", "--progress-seconds", "30",
        "--status-file", "/var/log/glm53/stage/status.json", "--metrics-host", "127.0.0.1", "--metrics-port", "9402",
        "--keep-running",
    ]  # fmt: skip
    assert "ports" not in stage  # metrics on loopback only, by default
    assert env(stage)["HF_HOME"] == "/models/huggingface" and env(stage)["HF_HUB_DISABLE_XET"] == "1"
    mounts = {m["name"]: m for m in stage["volumeMounts"]}
    assert mounts["weights"]["mountPath"] == "/models" and not mounts["weights"].get("readOnly")
    vllm = container(objs, "vllm")
    assert env(vllm)["HF_HUB_OFFLINE"] == "1" and env(vllm)["HF_HOME"] == "/models/huggingface"
    # The budget is the load's alone (30 min), not the download's.
    assert get(vllm, "startupProbe.periodSeconds") * get(vllm, "startupProbe.failureThreshold") == 30 * 60
    assert "--revision" not in vllm["args"]  # main: vLLM resolves it offline through refs/main


def test_the_rendered_stage_command_parses_with_the_commands_own_parser() -> None:
    args = build_parser().parse_args(["run", *stage_args({"weights": {"hfTokenSecret": {"name": "hf"}}})])
    assert (args.repo, args.revision, args.keep_running) == ("zai-org/GLM-5.3-Flash", "main", True)
    assert str(args.token_file) == "/var/run/secrets/huggingface/token"
    probe = build_parser().parse_args(STATUS[2:])
    assert str(probe.status_file) == "/var/log/glm53/stage/status.json"


def test_a_pinned_revision_is_staged_and_served() -> None:
    objs = render({"profile": "glm53", "weights": {"revision": COMMIT}})
    assert flag_value(container(objs, STAGE)["args"], "--revision") == COMMIT
    assert flag_value(container(objs, STAGE)["args"], "--repo") == "zai-org/GLM-5.3"
    assert flag_value(container(objs, "vllm")["args"], "--revision") == COMMIT


def test_the_token_comes_from_the_mounted_secret_never_an_env_value() -> None:
    objs = render({"weights": {"hfTokenSecret": {"name": "hf-token", "key": "token"}}})
    stage = container(objs, STAGE)
    assert flag_value(stage["args"], "--token-file") == "/var/run/secrets/huggingface/token"
    mounts = {m["name"]: m for m in stage["volumeMounts"]}
    assert mounts["hf-token"] == {"name": "hf-token", "mountPath": "/var/run/secrets/huggingface", "readOnly": True}
    assert not any("valueFrom" in e for e in stage["env"])
    assert get(pod_spec(objs), "volumes[name=hf-token].secret.secretName") == "hf-token"


@pytest.mark.parametrize("name", ["existing-pvc", "scaleout-shared"])
def test_pre_staged_read_only_claims_skip_staging(name: str) -> None:
    values = scenario_values(name)
    for objs in (render(values), render_cli(values)):  # what `helm template` prints too
        spec = pod_spec(objs)
        assert STAGE not in [c["name"] for c in spec.get("initContainers", [])]
        assert env(container(objs, "vllm"))["HF_HUB_OFFLINE"] == "1"  # weights.offline, as before


def test_each_statefulset_replica_stages_its_own_claim() -> None:
    objs = render({"replicaCount": 3})
    sts = engine_workload(objs)
    assert sts["kind"] == "StatefulSet"
    spec = get(sts, "spec.template.spec")
    assert [c["name"] for c in spec["initContainers"]] == [STAGE, "lmcache"]
    # The stage container's `weights` is the volumeClaimTemplate's: weights-<sts>-<ordinal>, one per replica.
    assert "weights" not in [v["name"] for v in spec["volumes"]]
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["weights"]
    assert get(spec, "initContainers[0].volumeMounts[name=weights].mountPath") == "/models"


@pytest.mark.parametrize(
    "weights",
    [
        {"source": "existingPvc", "existingClaim": "w", "existingClaimAccessMode": "ReadWriteMany"},
        {"source": "hostPath", "hostPath": "/mnt/nvme/models"},
        {"source": "none"},
    ],
)
def test_every_writable_volume_is_staged(weights: dict[str, Any]) -> None:
    assert init_names({"replicaCount": 3, "weights": weights}) == [STAGE, "lmcache"]


def test_staging_off_leaves_the_engine_to_download_online() -> None:
    objs = render({"weights": {"staging": {"enabled": False}}})
    assert [c["name"] for c in pod_spec(objs)["initContainers"]] == ["lmcache"]
    assert "HF_HUB_OFFLINE" not in env(container(objs, "vllm"))


def test_mock_mode_stages_only_for_the_real_engine_from_a_hub() -> None:
    assert init_names(scenario_values("mock")) == ["lmcache"]  # the stand-in engine loads no weights
    real = scenario_values("mock-real-engine")
    assert init_names(real) == ["tiny-model", "lmcache"]  # no hub: the model is made in the pod
    staged = {**real, "weights": {**real["weights"], "staging": {"endpoint": "http://127.0.0.1:45000"}}}
    objs = render(staged)
    assert [c["name"] for c in pod_spec(objs)["initContainers"]] == [STAGE, "lmcache"]
    args = container(objs, STAGE)["args"]
    assert flag_value(args, "--repo") == "glm53/tiny-hybrid"
    assert flag_value(args, "--endpoint") == "http://127.0.0.1:45000"
    # The CPU engine loads its model by path: the stage step links that path to the staged snapshot.
    assert flag_value(args, "--link") == "/models/tiny-hybrid"
    vllm = container(objs, "vllm")
    program = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny-hybrid"]
    assert vllm["args"][3:8] == program
    assert env(vllm)["HF_HUB_OFFLINE"] == "1" and "--revision" not in vllm["args"]
    assert container(objs, STAGE)["image"] == "glm53/mock:0.1.0"


def test_exposed_metrics_get_a_port_a_network_policy_and_a_pod_monitor() -> None:
    monitoring = {"serviceMonitor": {"enabled": True}}
    assert not [o for o in render({"monitoring": monitoring}) if o["kind"] == "PodMonitor"]
    values = {"weights": {"staging": {"metrics": {"expose": True}}}, "monitoring": monitoring}
    objs = render(values)
    stage = container(objs, STAGE)
    assert stage["ports"] == [{"name": "stage-metrics", "containerPort": 9402, "protocol": "TCP"}]
    assert flag_value(stage["args"], "--metrics-host") == "0.0.0.0"
    policy = next(p for p in objects(objs, "NetworkPolicy") if p["metadata"]["name"].endswith("-stage"))
    rule = get(policy, "spec.ingress[0]")
    assert rule["ports"] == [{"port": "stage-metrics", "protocol": "TCP"}]
    assert get(rule, "from[0].namespaceSelector.matchExpressions[0].values") == ["monitoring"]
    monitor = next(o for o in objs if o["kind"] == "PodMonitor")
    assert get(monitor, "spec.podMetricsEndpoints[0].port") == "stage-metrics"
    assert get(monitor, "spec.selector.matchLabels") == get(engine_workload(objs), "spec.selector.matchLabels")
    for obj in render_cli(values):
        if obj["kind"] not in {"PodMonitor", "ServiceMonitor"}:
            kubernetes_validate.validate(obj, OLDEST_KUBE, strict=True)


GUARDS: dict[str, tuple[dict[str, Any], str]] = {
    "a path is no repository": (
        {"vllm": {"model": "/models/glm"}},
        "vllm.model=/models/glm is a path, but the stage step downloads a hub repository; set "
        "weights.staging.enabled=false (the weights are already on the volume) or vllm.model to a repository id",
    ),
    "metrics port taken": (
        {"exporter": {"enabled": True, "port": 9402}},
        "weights.staging.metrics.port=9402 collides with a port another container of the pod listens on "
        "(8000, 5555, 8080, 9090, 9402); choose another, e.g. the default 9402",
    ),
}


@pytest.mark.parametrize("case", sorted(GUARDS))
def test_guards_refuse_with_their_message(case: str) -> None:
    assert_refused(*GUARDS[case])


@pytest.mark.parametrize(
    "staging",
    [{"reverify": "hash"}, {"maxWorkers": 0}, {"endpoint": "hub.local"}, {"metrics": {"port": 70000}}, {"x": 1}],
)
def test_the_schema_refuses_bad_staging_values(staging: dict[str, Any]) -> None:
    with pytest.raises(RenderError):
        render({"weights": {"staging": staging}})


def test_the_schema_refuses_an_empty_revision() -> None:
    with pytest.raises(RenderError):
        render({"weights": {"revision": ""}})
