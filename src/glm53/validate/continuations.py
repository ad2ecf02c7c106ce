"""Seed 004's third stage: paired continuations, cold recomputation against a reload from LMCache, token by token.

Each pair is one prompt from one of three synthetic templates: its continuation of `tokens` tokens computed cold (a
unique `cache_salt`: the control), and computed again after the prompt was stored in LMCache and vLLM's local prefix
cache was reset (the treatment: its prefix is restored from LMCache). A second cold continuation of the same prompt is
the baseline: a hybrid is not bit-exact even without a cache (seed 000), so the treatment is judged against how well
cold runs agree with each other. The figures are the seed's: exact-match rate, first divergence position, per-token
agreement. A profile whose outputs are bit-exact (GLM-5.3) must match exactly; any other fails when the treatment's
per-token agreement is lower than the baseline's (Welch's t-test at the validation's alpha).

The seed ran its 72 pairs across two fresh engine runs; this check runs them against the engine as it is, so repeat
`glm53 validate --checks continuations` after a restart for the second run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from glm53.errors import Glm53Error
from glm53.validate.client import Completion
from glm53.validate.prompts import document_qa_prompt, prompt_words, token_id_prompt
from glm53.validate.protocol import CheckResult, Shape, Target
from glm53.validate.stats import WelchResult, welch_t_test

TEMPLATES = ("document", "token-ids", "ledger")
DEFAULT_PAIRS = 72  # the seed's
DEFAULT_TOKENS = 256  # the seed's continuation length


@dataclass(frozen=True)
class Agreement:
    """How far two continuations agree: identical, where they first differ (None: nowhere), share of equal tokens."""

    exact: bool
    first_divergence: int | None
    per_token: float

    @classmethod
    def of(cls, a: Sequence[str], b: Sequence[str]) -> Agreement:
        length = max(len(a), len(b))
        same = [i < len(a) and i < len(b) and a[i] == b[i] for i in range(length)]
        first = next((i for i, equal in enumerate(same) if not equal), None)
        return cls(first is None, first, sum(same) / length if length else 1.0)


@dataclass(frozen=True)
class Pair:
    """One prompt's three continuations, compared: treatment (reloaded) and baseline (second cold) against control."""

    template: str
    prompt_tokens: int
    hit_tokens: int  # LMCache hit of the reloaded run
    control: tuple[str, ...]
    treatment: Agreement
    baseline: Agreement
    divergent_tokens: tuple[str, str] | None  # control's and treatment's token at the first divergence


@dataclass(frozen=True)
class ContinuationsResult(CheckResult):
    tokens: int
    alpha: float
    bit_exact: bool
    pairs: tuple[Pair, ...]
    welch: WelchResult
    failures: tuple[str, ...]

    def agreements(self, which: str) -> list[Agreement]:
        """`treatment` (reloaded vs cold) or `baseline` (cold vs cold), one per pair."""
        return [p.treatment if which == "treatment" else p.baseline for p in self.pairs]

    def exact_rate(self, which: str) -> float:
        return sum(a.exact for a in self.agreements(which)) / len(self.pairs)

    def mean_agreement(self, which: str) -> float:
        return sum(a.per_token for a in self.agreements(which)) / len(self.pairs)


def template_prompt(template: str, length: int, seed: int, id_range: tuple[int, int]) -> str | list[int]:
    """A deterministic prompt of about `length` tokens (exactly, for token ids) from one of the three templates."""
    if template == "document":
        return document_qa_prompt(length, seed).text
    if template == "token-ids":
        return token_id_prompt(length, seed, id_range)
    if template == "ledger":
        rng = random.Random(f"glm53-ledger-{seed}")
        words = prompt_words()
        lines = (f"entry {i}: {rng.choice(words)} {rng.randrange(10_000)}." for i in range(length))
        return " ".join(" ".join(lines).split()[:length])
    raise Glm53Error(f"unknown continuation template {template!r}; expected one of: {', '.join(TEMPLATES)}")


def prompt_length(chunk_size: int) -> int:
    """Two and a half chunks: whole chunks to restore and a partial one to recompute, as real prompts have."""
    return 2 * chunk_size + chunk_size // 2


def check_continuations(
    target: Target,
    chunk_size: int,
    pairs: int,
    tokens: int,
    alpha: float,
    bit_exact: bool,
    id_range: tuple[int, int],
) -> ContinuationsResult:
    """`pairs` prompts, cycling through the templates (ValidationConfig refuses fewer than one per template)."""
    shape = Shape(max_tokens=tokens, logprobs=1)
    length = prompt_length(chunk_size)
    results = []
    for index in range(pairs):
        template = TEMPLATES[index % len(TEMPLATES)]
        prompt = template_prompt(template, length, seed=1000 + index, id_range=id_range)
        control, _ = target.measured(prompt, target.salt("continuations", index, "control"), shape)
        baseline, _ = target.measured(prompt, target.salt("continuations", index, "baseline"), shape)
        salt = target.salt("continuations", index, "reloaded")
        target.prime(prompt, salt)
        treatment, hit = target.reloaded(prompt, salt, shape)
        pair = paired(template, control, baseline, treatment, hit)
        target.progress.step(
            f"continuations: pair {index + 1}/{pairs} ({template}): reloaded agrees "
            f"{100 * pair.treatment.per_token:.0f}%, cold baseline {100 * pair.baseline.per_token:.0f}%, "
            f"LMCache hit {hit} tokens"
        )
        results.append(pair)
    return judge_continuations(results, tokens, alpha, bit_exact)


def paired(template: str, control: Completion, baseline: Completion, treatment: Completion, hit: int) -> Pair:
    if not control.tokens:
        raise Glm53Error(
            "vLLM returned no tokens in logprobs.tokens for a request with logprobs=1; validation needs them"
        )
    against = Agreement.of(control.tokens, treatment.tokens)
    divergent = None
    if against.first_divergence is not None:
        at = against.first_divergence
        divergent = (_token(control.tokens, at), _token(treatment.tokens, at))
    return Pair(
        template,
        control.prompt_tokens or 0,
        hit,
        control.tokens,
        against,
        Agreement.of(control.tokens, baseline.tokens),
        divergent,
    )


def _token(tokens: Sequence[str], at: int) -> str:
    return tokens[at] if at < len(tokens) else "(end)"


def judge_continuations(pairs: Sequence[Pair], tokens: int, alpha: float, bit_exact: bool) -> ContinuationsResult:
    welch = welch_t_test([p.baseline.per_token for p in pairs], [p.treatment.per_token for p in pairs])
    failures = []
    missed = sum(1 for p in pairs if p.hit_tokens <= 0)
    if missed:
        failures.append(
            f"continuations: {missed} of {len(pairs)} reloaded runs got no LMCache hit, so they measured no reload"
        )
    diverged = [p for p in pairs if not p.treatment.exact]
    if bit_exact and diverged:
        first = diverged[0]
        control, reloaded = first.divergent_tokens or ("", "")
        failures.append(
            f"continuations: {len(diverged)} of {len(pairs)} continuations reloaded from LMCache differ from their "
            f"cold control (first: a {first.template} prompt, at token {first.treatment.first_divergence}: cold "
            f"{control!r}, reloaded {reloaded!r}); the profile marks this model's outputs bit-exact"
        )
    elif not bit_exact and welch.p < alpha and welch.b.mean < welch.a.mean:
        failures.append(
            f"continuations: reloaded continuations agree with their cold control on {100 * welch.b.mean:.1f}% of "
            f"tokens, cold runs with each other on {100 * welch.a.mean:.1f}% (Welch p = {welch.p:.3g} < alpha "
            f"{alpha:g}): the restored state changes the output more than recomputation does"
        )
    return ContinuationsResult(tokens, alpha, bit_exact, tuple(pairs), welch, tuple(failures))
