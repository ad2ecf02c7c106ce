"""vllm.generation: the default 0.33.0 renders as if the value did not exist, and the opt-in 0.34.0 changes exactly two
things, the serving image's tag and the flag that keeps vLLM 0.34's extensible KV cache off beside the LMCache sidecar.

That the 0.34.0 argv parses with 0.34.0's own parser, and that its environment passes 0.34.0's own check, is
test_chart_argv_conformance.py's part; the guards' messages are test_chart_guards.py's.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.chartkit import (
    APP_VERSION,
    NEXT_VLLM,
    Obj,
    at_vllm,
    container,
    notes,
    render,
    scenario_values,
    vllm_next_scenarios,
)

EXTENSIBLE_OFF = "--no-enable-extensible-kv-cache"


def without_the_next_generation(node: Any) -> Any:
    """`node` with the two things 0.34.0 changes undone: the flag dropped, the tag's `-vllm0.34.0` removed."""
    if isinstance(node, dict):
        return {key: without_the_next_generation(value) for key, value in node.items()}
    if isinstance(node, list):
        return [without_the_next_generation(item) for item in node if item != EXTENSIBLE_OFF]
    if isinstance(node, str):
        return node.replace(f":{APP_VERSION}-vllm{NEXT_VLLM}", f":{APP_VERSION}")
    return node


def test_the_default_generation_is_033_and_renders_as_if_the_value_did_not_exist() -> None:
    default = render({})
    assert default == render(at_vllm({}, "0.33.0"))
    assert EXTENSIBLE_OFF not in container(default, "vllm")["args"]
    assert container(default, "vllm")["image"].endswith(f":{APP_VERSION}")


@pytest.mark.parametrize("name", vllm_next_scenarios())
def test_at_034_only_the_tag_and_the_extensible_kv_cache_flag_change(name: str) -> None:
    values = scenario_values(name)
    current, following = render(values), render(at_vllm(values, NEXT_VLLM))

    assert without_the_next_generation(following) == current
    vllm = container(following, "vllm")
    assert f":{APP_VERSION}-vllm{NEXT_VLLM}" in vllm["image"]
    # Right after the connector's config, once: the chart's own flags come after vllm.extraArgs, so it wins.
    args: list[str] = vllm["args"]
    assert args.count(EXTENSIBLE_OFF) == 1
    assert args[args.index("--kv-transfer-config") + 2] == EXTENSIBLE_OFF


def test_without_the_sidecar_034_leaves_the_extensible_kv_cache_to_vllm() -> None:
    """Nothing shares the KV cache through CUDA IPC then, so 0.34's default (and an extra argument) stand."""
    values: Obj = {"lmcache": {"enabled": False}, "vllm": {"extraArgs": ["--enable-extensible-kv-cache"]}}
    args = container(render(at_vllm(values, NEXT_VLLM)), "vllm")["args"]
    assert "--enable-extensible-kv-cache" in args and EXTENSIBLE_OFF not in args


def test_the_notes_say_034_is_not_validated_and_name_its_image() -> None:
    text = notes(at_vllm({}, NEXT_VLLM))
    assert f"vllm.generation={NEXT_VLLM} is opt-in and NOT VALIDATED WITH LMCACHE" in text
    assert f"glm53/vllm-lmcache:{APP_VERSION}-vllm{NEXT_VLLM}" in text
    assert "vllm.generation" not in notes({})


def test_the_tag_carries_both_generations_in_the_playbooks_order() -> None:
    values = at_vllm({"lmcache": {"generation": "0.5.7rc2", "apiKey": {"secretName": "k"}}}, NEXT_VLLM)
    image = container(render(values), "vllm")["image"]
    assert image.endswith(f":{APP_VERSION}-vllm{NEXT_VLLM}-lmcache0.5.7rc2")
