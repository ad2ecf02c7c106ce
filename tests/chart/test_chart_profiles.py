"""The chart deploys exactly what the toolkit's profiles table says: one source of truth for model facts."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from glm53.profiles import PROFILES, profile_as_dict
from tests.support.chartkit import CHART_DIR, container, flag_value, get, pod_spec, render


def test_profiles_json_is_the_toolkits_output() -> None:
    # `glm53 profiles --json` is what the README tells maintainers to regenerate the file with.
    done = subprocess.run(
        [sys.executable, "-m", "glm53", "profiles", "--json"], capture_output=True, text=True, check=True
    )
    shipped = (CHART_DIR / "files" / "profiles.json").read_text()
    assert json.loads(shipped) == json.loads(done.stdout)
    assert json.loads(shipped) == {name: profile_as_dict(p) for name, p in PROFILES.items()}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_rendered_pod_agrees_with_the_profile(name: str) -> None:
    profile = PROFILES[name]
    objs = render({"profile": name})
    vllm_args = container(objs, "vllm")["args"]
    lmcache_args = container(objs, "lmcache")["args"]
    tp = profile.tensor_parallel_size

    assert vllm_args[vllm_args.index("serve") + 1] == profile.model_id
    assert flag_value(vllm_args, "--tensor-parallel-size") == str(tp)
    assert get(container(objs, "vllm"), "resources.limits.nvidia\\.com/gpu") == profile.gpus == tp
    assert get(container(objs, "vllm"), "resources.requests.nvidia\\.com/gpu") == profile.gpus
    # The chunk is the profile's recommendation and a multiple of every cacheable group's block at this TP size.
    chunk = int(flag_value(lmcache_args, "--chunk-size"))
    assert chunk == profile.recommended_chunk_size
    blocks = [b for b in profile.expected_groups(profile.unified_block_size(tp)) if b > 0]
    assert chunk % math.lcm(*blocks) == 0
    assert ("--separate-object-groups" in lmcache_args) or not profile.separate_object_groups_required
    assert "--enable-prefix-caching" in vllm_args
    if profile.text_only_flag.value is not None:
        assert flag_value(vllm_args, profile.text_only_flag.flag) == profile.text_only_flag.value
    else:
        assert profile.text_only_flag.flag not in vllm_args
    for extra in profile.serving_extras:
        assert flag_value(vllm_args, extra.flag) == extra.value
    assert flag_value(vllm_args, "--kv-cache-dtype") == profile.kv_cache_dtype
    # The probe checks the same profile, TP size and chunk.
    probe = get(container(objs, "vllm"), "startupProbe.exec.command")
    assert flag_value(probe, "--profile") == name
    assert flag_value(probe, "--tensor-parallel-size") == str(tp)
    assert flag_value(probe, "--chunk-size") == str(chunk)
    assert pod_spec(objs)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}


def test_tensor_parallel_override_keeps_fixed_block_profiles_chunk() -> None:
    # GLM-5.3's block of 64 does not depend on TP, so its recommendation holds at TP 4 too; the GPUs follow TP.
    objs = render(
        {"profile": "glm53", "vllm": {"tensorParallelSize": 4}, "allowUnverified": {"tensorParallelSize": True}}
    )
    assert flag_value(container(objs, "lmcache")["args"], "--chunk-size") == "256"
    assert get(container(objs, "vllm"), "resources.limits.nvidia\\.com/gpu") == 4
    assert flag_value(container(objs, "vllm")["args"], "--tensor-parallel-size") == "4"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_speculative_decoding_uses_the_profiles_mtp_tokens(name: str) -> None:
    objs = render({"profile": name, "vllm": {"speculativeDecoding": {"enabled": True}}})
    config = json.loads(flag_value(container(objs, "vllm")["args"], "--speculative-config"))
    assert config == {"method": "mtp", "num_speculative_tokens": PROFILES[name].mtp_speculative_tokens}
