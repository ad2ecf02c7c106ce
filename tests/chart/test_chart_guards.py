"""Every guard refuses its bad input with a message naming the fix; the schema refuses unknown keys and plain secrets.

Messages are asserted from both engines: Helm 4 through helm-python-sdk and the Helm 3 CLI users run.
"""

from __future__ import annotations

from typing import Any

import pytest
from chartkit import RenderError, render, render_cli

GUARDS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown profile": (
        {"profile": "glm52"},
        'profile "glm52" is unknown; set profile to one of: glm53, glm53-flash',
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
        {"vllm": {"tensorParallelSize": 8}},
        "GLM-5.3-Flash's unified block size N was measured at TP 4 only, not at TP 8, so the chunk size is unknown; "
        'set lmcache.chunkSize to the N vLLM logs at TP 8 ("Setting attention block size to N tokens"), or set '
        "lmcache.negotiate=true with a negotiating LMCache build",
    ),
    "separate object groups off for a hybrid": (
        {"lmcache": {"separateObjectGroups": False}},
        "lmcache.separateObjectGroups=false, but GLM-5.3-Flash is a hybrid whose state groups need their own cache "
        "objects; set lmcache.separateObjectGroups=true",
    ),
    "run_script": (
        {"lmcache": {"extraArgs": ["--run-script-api-enabled"]}},
        "lmcache.extraArgs/extraEnv enable /run_script, which executes arbitrary Python sent to the unauthenticated "
        "admin API; remove --run-script-api-enabled and LMCACHE_RUN_SCRIPT_API_ENABLED",
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
}


@pytest.mark.parametrize("case", sorted(GUARDS))
def test_guard_refuses_with_its_message(case: str) -> None:
    values, message = GUARDS[case]
    with pytest.raises(RenderError) as sdk:
        render(values)
    assert message in sdk.value.message
    with pytest.raises(RenderError) as cli:
        render_cli(values)
    assert message in cli.value.message


@pytest.mark.parametrize(
    "values",
    [
        {"vllm": {"kvCacheDtype": "fp8"}, "profile": "glm53"},  # GLM-5.3 has no Hopper FP8 restriction
        {"vllm": {"batchInvariant": True}, "profile": "glm53"},
        {"vllm": {"devMode": True}, "validation": {"enabled": True}},
        {"lmcache": {"chunkSize": 2304}},  # 2 x 1152
        {"lmcache": {"chunkSize": 1024}, "profile": "glm53"},  # the other validated GLM-5.3 size
        {"vllm": {"tensorParallelSize": 8, "gpus": 8}, "lmcache": {"chunkSize": 2048}},  # explicit chunk: probe checks
        {"vllm": {"tensorParallelSize": 8}, "lmcache": {"negotiate": True}},
        {"lmcache": {"enabled": False}, "vllm": {"enablePrefixCaching": False}},
        {"vllm": {"extraEnv": [{"name": "VLLM_BATCH_INVARIANT", "value": "0"}]}},
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
        ({"lmcache": {"chunkSize": "1152"}}, "chunkSize"),
        ({"vllm": {"kvCacheDtype": "int4"}}, "kvCacheDtype"),
        ({"weights": {"source": "s3"}}, "source"),
        ({"updateStrategy": {"type": "Surge"}}, "type"),
    ],
)
def test_schema_refuses_unknown_keys_and_bad_types(values: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RenderError, match="values don't meet the specifications of the schema") as error:
        render(values)
    assert fragment in error.value.message
