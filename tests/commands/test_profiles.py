"""`glm53 profiles`: the table for people, the stable JSON the Helm chart is generated from, one profile by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from glm53.commands.profiles import profile_text, profiles_json
from glm53.errors import Glm53Error
from glm53.profiles import PROFILES, get_profile, profile_as_dict

# The chart's `files/profiles.json` and its templates read these keys; renaming one breaks the chart.
CHART_KEYS = {
    "name", "modelId", "displayName", "architecture", "numLayers", "layerMix", "tensorParallelSize", "gpus", "groups",
    "unifiedBlockSizeByTp", "expectedGroupTokensPerBlock", "requiredAlignment", "strictPrefix", "recommendedChunkSize",
    "validatedChunkSizes", "prefixCachingRequired", "separateObjectGroupsRequired", "kvCacheDtype",
    "fp8KvCacheHopperOk", "batchInvariantOk", "bitExactOutputs", "textOnlyFlag", "servingExtras",
    "mtpSpeculativeTokens", "mtpValidatedWithLmcache", "tinyModel", "answersQuestions", "promptTokenIds", "basis",
    "notes",
}  # fmt: skip


def run_profiles(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "glm53", "profiles", *args], capture_output=True, text=True, check=False
    )


def test_json_is_the_stable_document_the_chart_is_generated_from() -> None:
    result = run_profiles("--json")
    assert result.returncode == 0
    assert result.stdout == profiles_json(list(PROFILES.values())) + "\n"
    assert result.stdout == run_profiles("--json").stdout  # byte-for-byte repeatable
    document = json.loads(result.stdout)
    assert list(document) == sorted(PROFILES)
    assert result.stdout == json.dumps(document, indent=2, sort_keys=True) + "\n"
    for name, profile in document.items():
        assert set(profile) == CHART_KEYS
        assert profile == json.loads(json.dumps(profile_as_dict(get_profile(name))))


def test_json_carries_the_seeds_facts() -> None:
    document = json.loads(run_profiles("--json").stdout)
    flash, glm53 = document["glm53-flash"], document["glm53"]
    assert flash["expectedGroupTokensPerBlock"] == [1152, 1152, 1152, 1152, 1152, 0]
    assert flash["unifiedBlockSizeByTp"] == {"4": 1152}
    assert (flash["requiredAlignment"], flash["recommendedChunkSize"], flash["strictPrefix"]) == (1152, 1152, True)
    assert (flash["tensorParallelSize"], flash["numLayers"], flash["mtpSpeculativeTokens"]) == (4, 45, 5)
    assert glm53["expectedGroupTokensPerBlock"] == [64]
    assert (glm53["tensorParallelSize"], glm53["validatedChunkSizes"], glm53["strictPrefix"]) == (8, [256, 1024], False)


def test_one_profile_by_name() -> None:
    result = run_profiles("glm53", "--json")
    assert list(json.loads(result.stdout)) == ["glm53"]
    text = run_profiles("glm53-flash").stdout
    assert text.startswith("glm53-flash: GLM-5.3-Flash\n")
    assert "  groups           [N, N, N, N, N, 0] (N=1152 at TP 4)\n" in text
    assert "glm53: GLM-5.3" not in text


def test_table_lists_every_profile() -> None:
    text = run_profiles().stdout
    assert "glm53-flash: GLM-5.3-Flash" in text
    assert "glm53: GLM-5.3" in text
    assert "  text only        no --limit-mm-per-prompt (text-only model; no multimodal limit is needed)" in text
    assert '  text only        --limit-mm-per-prompt {"image":0,"video":0}' in text


def test_unknown_profile_is_one_line_exit_2() -> None:
    result = run_profiles("glm6")
    assert result.returncode == 2
    known = "glm53-flash, glm53, tiny-dense, tiny-hybrid"
    assert result.stderr == f"glm53 profiles: error: unknown profile 'glm6'; expected one of: {known}\n"


def test_expected_groups_needs_n_for_a_hybrid() -> None:
    assert get_profile("glm53-flash").expected_groups(2304) == (2304, 2304, 2304, 2304, 2304, 0)
    assert get_profile("glm53").expected_groups(None) == (64,)
    with pytest.raises(Glm53Error, match="depend on vLLM's unified block size N"):
        get_profile("glm53-flash").expected_groups(None)


def test_unknown_facts_are_unknown_and_every_fact_says_what_it_rests_on() -> None:
    document = json.loads(run_profiles("--json").stdout)
    flash, glm53 = document["glm53-flash"], document["glm53"]
    # Seed 001 says nothing about FP8 KV cache or batch-invariant mode for GLM-5.3: null, never a guessed "fine".
    assert (glm53["fp8KvCacheHopperOk"], glm53["batchInvariantOk"]) == (None, None)
    assert glm53["basis"]["fp8KvCacheHopperOk"].startswith("unverified: seed 001")
    # Seed 000 states both for GLM-5.3-Flash, as refusals.
    assert (flash["fp8KvCacheHopperOk"], flash["batchInvariantOk"]) == (False, False)
    for profile in (flash, glm53):
        assert set(profile["basis"]) <= set(profile), "basis keys name facts of the profile"
        for fact in ("tensorParallelSize", "fp8KvCacheHopperOk", "batchInvariantOk", "bitExactOutputs"):
            assert profile["basis"][fact].startswith(("seed 0", "unverified: seed 0")), (profile["name"], fact)
        unknown = {key for key, value in profile.items() if value is None and key in profile["basis"]}
        assert all(profile["basis"][key].startswith("unverified") for key in unknown)
    assert get_profile("glm53").fp8_kv_cache_hopper is None


def test_text_view_shows_unverified_facts_as_unverified() -> None:
    glm53, flash = profile_text(get_profile("glm53")), profile_text(get_profile("glm53-flash"))
    assert "FP8 on Hopper: unverified" in glm53
    assert "batch invariant  unverified" in glm53
    assert "FP8 on Hopper: no" in flash
    assert "batch invariant  no" in flash
