"""The prompts validation sends: exact lengths, determinism, the planted answer, the nine boundary lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from glm53.errors import Glm53Error
from glm53.validate.prompts import (
    DEFAULT_DOCUMENT_TOKENS,
    boundary_lengths,
    document_qa_prompt,
    prompt_from_file,
    token_id_prompt,
)


def test_default_document_is_the_seeds_8507_tokens_with_a_planted_answer() -> None:
    prompt = document_qa_prompt()
    assert DEFAULT_DOCUMENT_TOKENS == 8507
    assert prompt.words == len(prompt.text.split()) == 8507
    assert prompt.answer is not None
    assert f"ledger seven is {prompt.answer}." in prompt.text
    assert prompt.text.rstrip().endswith("Answer:")
    assert prompt.is_correct(f"The code is {prompt.answer}.") is True
    assert prompt.is_correct("I do not know") is False


@pytest.mark.parametrize("tokens", [41, 1151, 1152, 5040, 8507, 20000])
def test_document_length_is_exact(tokens: int) -> None:
    assert len(document_qa_prompt(tokens).text.split()) == tokens


def test_document_is_deterministic_per_seed() -> None:
    assert document_qa_prompt(seed=3) == document_qa_prompt(seed=3)
    assert document_qa_prompt(seed=3).text != document_qa_prompt(seed=4).text


def test_too_short_a_document_is_refused() -> None:
    with pytest.raises(Glm53Error, match="needs at least 41 tokens, got 10"):
        document_qa_prompt(10)


@pytest.mark.parametrize("length", [1, 1151, 1152, 1153, 3457])
def test_token_id_prompts_have_exact_lengths(length: int) -> None:
    prompt = token_id_prompt(length, seed=0)
    assert len(prompt) == length
    assert all(isinstance(t, int) and 1000 <= t < 30000 for t in prompt)
    assert prompt == token_id_prompt(length, seed=0)


def test_token_id_prompts_differ_from_the_first_token_between_seeds() -> None:
    assert token_id_prompt(64, seed=0)[0] != token_id_prompt(64, seed=1)[0]


def test_boundary_lengths_are_seed_004s_nine() -> None:
    assert boundary_lengths(1152) == (1151, 1152, 1153, 2303, 2304, 2305, 3455, 3456, 3457)
    assert boundary_lengths(256) == (255, 256, 257, 511, 512, 513, 767, 768, 769)


def test_prompt_file_is_used_as_is_without_a_known_answer(tmp_path: Path) -> None:
    path = tmp_path / "prompt.txt"
    path.write_text("a b c\nd e", encoding="utf-8")
    prompt = prompt_from_file(path)
    assert (prompt.text, prompt.words, prompt.answer) == ("a b c\nd e", 5, None)
    assert prompt.is_correct("anything") is None


def test_missing_prompt_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(Glm53Error, match=r"cannot read the prompt file .*missing\.txt.*; give a UTF-8 text file"):
        prompt_from_file(tmp_path / "missing.txt")


def test_empty_prompt_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("  \n", encoding="utf-8")
    with pytest.raises(Glm53Error, match="is empty; give the long document-QA prompt"):
        prompt_from_file(path)
