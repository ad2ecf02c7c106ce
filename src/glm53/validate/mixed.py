"""The mixed restore (LMCache issue #4247): a prompt served partly by vLLM's own prefix cache and partly by LMCache.

On hybrid models this path silently corrupted output upstream, while every hit counter looked right. The closest
sequence the HTTP API allows: store the whole prompt in LMCache once (prime), then for each run reset vLLM's local
prefix cache, send the prompt's first chunk alone (vLLM now holds it in its local cache), then the whole prompt: its
head comes from vLLM's local cache and the rest of its whole chunks from LMCache. Those runs are
compared with cold runs of the same prompt by the equivalence test's statistics (first-token log-probs under Welch's
t-test; identical outputs for a bit-exact profile), and every mixed run must show both kinds of hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from glm53.validate.prompts import token_id_prompt
from glm53.validate.protocol import CheckResult, Shape, Target, bit_exact_failures, logprobs_differ
from glm53.validate.stats import WelchResult, welch_t_test

MIXED_SHAPE = Shape(max_tokens=8, logprobs=5)


@dataclass(frozen=True)
class MixedSample:
    """One run: its first-token log-prob, output, and where its cached tokens came from."""

    logprob: float
    text: str
    local_tokens: int  # usage.cached_tokens less LMCache's share
    lmcache_tokens: int


@dataclass(frozen=True)
class MixedResult(CheckResult):
    prompt_tokens: int
    head_tokens: int
    alpha: float
    cold: tuple[MixedSample, ...]
    mixed: tuple[MixedSample, ...]
    welch: WelchResult
    failures: tuple[str, ...]


def mixed_prompt_length(chunk_size: int) -> int:
    """Three whole chunks and half of a fourth: one to hold locally, two to restore, a tail to recompute."""
    return 3 * chunk_size + chunk_size // 2


def check_mixed(
    target: Target, chunk_size: int, runs: int, alpha: float, bit_exact: bool, id_range: tuple[int, int]
) -> MixedResult:
    prompt = token_id_prompt(mixed_prompt_length(chunk_size), seed=4247, id_range=id_range)
    head = prompt[:chunk_size]

    def sample(condition: str, index: int, salt: str, prepare: bool) -> MixedSample:
        if prepare:
            target.client.reset_prefix_cache(reset_external=False)
            target.prime(head, salt)  # now in vLLM's local cache
        completion, lmcache = target.measured(prompt, salt, MIXED_SHAPE)
        local = max(0, (completion.cached_tokens or 0) - lmcache)
        logprob = completion.first_logprob if completion.first_logprob is not None else float("nan")
        target.progress.step(
            f"mixed: {condition} run {index + 1}/{runs}: log-prob {logprob:.4f}, local hit {local} tokens, "
            f"LMCache hit {lmcache} tokens"
        )
        return MixedSample(logprob, completion.text, local, lmcache)

    cold = [sample("cold", i, target.salt("mixed", "cold", i), prepare=False) for i in range(runs)]
    salt = target.salt("mixed", "restored")
    target.progress.step("mixed: storing the prompt in LMCache")
    target.prime(prompt, salt)
    mixed = [sample("mixed", i, salt, prepare=True) for i in range(runs)]
    return judge_mixed(cold, mixed, len(prompt), len(head), alpha, bit_exact)


def judge_mixed(
    cold: Sequence[MixedSample],
    mixed: Sequence[MixedSample],
    prompt_tokens: int,
    head_tokens: int,
    alpha: float,
    bit_exact: bool,
) -> MixedResult:
    welch = welch_t_test([s.logprob for s in cold], [s.logprob for s in mixed])
    failures = []
    unmixed = sum(1 for s in mixed if s.local_tokens <= 0 or s.lmcache_tokens <= 0)
    if unmixed:
        failures.append(
            f"mixed: {unmixed} of {len(mixed)} runs were not served partly by vLLM's prefix cache and partly by "
            "LMCache, so they did not exercise the mixed restore (is prefix caching on?)"
        )
    if logprobs_differ(welch, alpha):
        failures.append(
            f"mixed: the first-token log-probs differ between cold runs (mean {welch.a.mean:.4f}) and runs restored "
            f"from vLLM's prefix cache plus LMCache (mean {welch.b.mean:.4f}): Welch p = {welch.p:.3g} < alpha "
            f"{alpha:g} — the mixed restore of LMCache issue #4247"
        )
    failures += bit_exact_failures("mixed", [s.text for s in cold], [s.text for s in mixed], bit_exact)
    return MixedResult(prompt_tokens, head_tokens, alpha, tuple(cold), tuple(mixed), welch, tuple(failures))
