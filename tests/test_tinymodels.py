"""The tiny CPU test models (`glm53.tinymodels`, `glm53 tiny-model`): deterministic, the seed's prompt length in tokens,
and a manifest that catches a changed file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from glm53 import tinymodels
from glm53.profiles import PROFILES
from glm53.validate.prompts import DEFAULT_DOCUMENT_TOKENS, document_qa_prompt


def tiny_model(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "glm53", "tiny-model", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_the_tokenizer_makes_the_seeds_prompt_8507_tokens(tmp_path: Path) -> None:
    """Every word of the validation's document is one token, so the seed's 8507-token prompt is 8507 tokens here."""
    from tokenizers import Tokenizer

    tinymodels.train_tokenizer(tmp_path)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == tinymodels.VOCAB_SIZE
    for seed in (0, 1, 7):
        prompt = document_qa_prompt(DEFAULT_DOCUMENT_TOKENS, seed)
        assert len(tokenizer.encode(prompt.text).ids) == DEFAULT_DOCUMENT_TOKENS
        assert tokenizer.decode(tokenizer.encode(prompt.text).ids) == prompt.text


def test_every_tiny_profile_names_a_shape_and_a_token_range_inside_its_vocabulary() -> None:
    for profile in PROFILES.values():
        if profile.tiny_model is None:
            continue
        shape = tinymodels.get_shape(profile.tiny_model.shape)
        low, high = profile.prompt_token_ids
        assert 0 <= low < high <= shape.config["vocab_size"]
        assert shape.architecture == profile.architecture
        assert shape.config["num_hidden_layers"] == profile.num_layers


@pytest.mark.slow
def test_builds_are_byte_identical_and_check_catches_a_changed_file(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for directory in (first, second):
        result = tiny_model("--shape", "dense", "--out", str(directory))
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"glm53 tiny-model: dense (Qwen3ForCausalLM) in {directory}: 4 files")
    manifests = [json.loads((d / tinymodels.MANIFEST).read_text()) for d in (first, second)]
    assert manifests[0] == manifests[1]
    assert sorted(manifests[0]["files"]) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert tiny_model("--shape", "dense", "--out", str(first), "--check").returncode == 0
    # A complete model is left as it is (a shared weights volume: another replica's engine may be reading it).
    weights = first / "model.safetensors"
    written = weights.stat().st_mtime_ns
    again = tiny_model("--shape", "dense", "--out", str(first))
    assert again.returncode == 0, again.stderr
    assert again.stdout == (
        f"glm53 tiny-model: {first} already holds the dense model its manifest names; left as it is\n"
    )
    assert weights.stat().st_mtime_ns == written
    (first / "config.json").write_text("{}")
    result = tiny_model("--shape", "dense", "--out", str(first), "--check")
    assert result.returncode == 1
    assert result.stderr == (
        f"glm53 tiny-model: error: {first} differs from its manifest in config.json; build it again\n"
    )
    # A damaged one is built again.
    assert tiny_model("--shape", "dense", "--out", str(first)).returncode == 0
    assert tiny_model("--shape", "dense", "--out", str(first), "--check").returncode == 0


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    result = tiny_model("--shape", "dense", "--out", str(tmp_path), "--check")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert f"{tmp_path} holds no readable {tinymodels.MANIFEST}" in result.stderr
    result = tiny_model("--shape", "moe", "--out", str(tmp_path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
