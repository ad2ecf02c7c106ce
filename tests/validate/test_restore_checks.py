"""The paired continuations (seed 004, third stage) and the mixed local + LMCache restore (LMCache #4247): the pure
judges, with the messages a person reads."""

from __future__ import annotations

import pytest

from glm53.validate.continuations import (
    TEMPLATES,
    Agreement,
    Pair,
    judge_continuations,
    prompt_length,
    template_prompt,
)
from glm53.validate.mixed import MixedSample, judge_mixed, mixed_prompt_length


def test_agreement_counts_equal_positions_and_finds_the_first_divergence() -> None:
    assert Agreement.of(["a", "b"], ["a", "b"]) == Agreement(True, None, 1.0)
    assert Agreement.of(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == Agreement(False, 2, 0.75)
    # A continuation that stops early disagrees on every position it lacks.
    assert Agreement.of(["a", "b", "c", "d"], ["a", "b"]) == Agreement(False, 2, 0.5)
    assert Agreement.of([], []) == Agreement(True, None, 1.0)


def pair(treatment: list[str], baseline: list[str], hit: int = 2304, template: str = "document") -> Pair:
    control = ["t0", "t1", "t2", "t3"]
    against = Agreement.of(control, treatment)
    at = against.first_divergence
    divergent = None if at is None else (control[at], treatment[at] if at < len(treatment) else "(end)")
    return Pair(template, 2880, hit, tuple(control), against, Agreement.of(control, baseline), divergent)


SAME = ["t0", "t1", "t2", "t3"]


def test_identical_continuations_pass_on_a_bit_exact_profile() -> None:
    result = judge_continuations([pair(SAME, SAME)] * 6, 4, 0.05, bit_exact=True)
    assert result.passed
    assert result.exact_rate("treatment") == 1.0 and result.mean_agreement("baseline") == 1.0


def test_a_bit_exact_profile_fails_on_one_divergent_token_naming_where() -> None:
    result = judge_continuations(
        [pair(SAME, SAME)] * 5 + [pair(["t0", "zz", "t2", "t3"], SAME, template="ledger")], 4, 0.05, True
    )
    assert result.failures == (
        "continuations: 1 of 6 continuations reloaded from LMCache differ from their cold control (first: a ledger "
        "prompt, at token 1: cold 't1', reloaded 'zz'); the profile marks this model's outputs bit-exact",
    )


def test_a_hybrid_fails_only_when_reloads_agree_less_than_cold_runs_do() -> None:
    noisy = [pair(["t0", "t1", "x", "t3"], ["t0", "t1", "t2", "y"]) for _ in range(8)]
    assert judge_continuations(noisy, 4, 0.05, bit_exact=False).passed  # 75 % either way: recomputation's own noise
    worse = [pair(["t0", "x", "y", "z"], ["t0", "t1", "t2", "t3" if i % 2 else "y"]) for i in range(8)]
    (failure,) = judge_continuations(worse, 4, 0.05, bit_exact=False).failures
    assert failure.startswith(
        "continuations: reloaded continuations agree with their cold control on 25.0% of tokens, "
    )
    assert failure.endswith("the restored state changes the output more than recomputation does")


def test_a_reload_without_an_lmcache_hit_measured_nothing() -> None:
    (failure,) = judge_continuations([pair(SAME, SAME, hit=0)] + [pair(SAME, SAME)] * 2, 4, 0.05, True).failures
    assert failure == "continuations: 1 of 3 reloaded runs got no LMCache hit, so they measured no reload"


@pytest.mark.parametrize("template", TEMPLATES)
def test_templates_are_deterministic_and_distinct_per_seed(template: str) -> None:
    a = template_prompt(template, prompt_length(256), seed=1, id_range=(8, 4096))
    assert a == template_prompt(template, prompt_length(256), seed=1, id_range=(8, 4096))
    assert a != template_prompt(template, prompt_length(256), seed=2, id_range=(8, 4096))
    if isinstance(a, list):
        assert len(a) == 640 and all(8 <= t < 4096 for t in a)
    else:
        assert len(a.split()) == 640


def sample(logprob: float, local: int = 1152, lmcache: int = 2304, text: str = " 42") -> MixedSample:
    return MixedSample(logprob, text, local, lmcache)


def test_mixed_restore_passes_when_it_matches_cold_runs() -> None:
    result = judge_mixed([sample(-1.0)] * 8, [sample(-1.0)] * 8, mixed_prompt_length(1152), 1152, 0.05, True)
    assert result.passed and result.prompt_tokens == 4032


def test_mixed_restore_that_shifts_the_logprob_fails_naming_the_issue() -> None:
    (failure,) = judge_mixed([sample(-1.0)] * 8, [sample(-1.5)] * 8, 4032, 1152, 0.05, False).failures
    assert failure == (
        "mixed: the first-token log-probs differ between cold runs (mean -1.0000) and runs restored from vLLM's prefix "
        "cache plus LMCache (mean -1.5000): Welch p = 0 < alpha 0.05 — the mixed restore of LMCache issue #4247"
    )


def test_runs_that_were_not_mixed_did_not_exercise_the_path() -> None:
    mixed = [sample(-1.0, local=0)] + [sample(-1.0)] * 7
    (failure,) = judge_mixed([sample(-1.0)] * 8, mixed, 4032, 1152, 0.05, False).failures
    assert failure.startswith("mixed: 1 of 8 runs were not served partly by vLLM's prefix cache and partly by LMCache")


def test_a_bit_exact_profile_needs_identical_mixed_outputs() -> None:
    mixed = [sample(-1.0, text=" 7")] + [sample(-1.0)] * 7
    (failure,) = judge_mixed([sample(-1.0)] * 8, mixed, 4032, 1152, 0.05, True).failures
    assert failure.startswith("mixed: the profile marks this model's outputs bit-exact, but its 8 cold and 8 ")


def test_a_rounding_sized_shift_of_a_deterministic_engine_is_no_difference() -> None:
    """Zero variance makes Welch's p 0 for any shift; the real CPU engine's separate prefill moves the mean by 1e-4."""
    result = judge_mixed([sample(-0.2397)] * 8, [sample(-0.2398)] * 8, 1152, 256, 0.05, True)
    assert result.welch.p == 0 and result.passed
