"""The three checks of the validation protocol, each a function that talks to vLLM and returns a typed result.

- equivalence (seed 000): first-token log-probs of cold runs (a unique `cache_salt` each) against runs served from
  LMCache after vLLM's local prefix cache was reset; Welch's t-test must not tell them apart, LMCache must hit, and
  every answer must be right ("every answer in both conditions was correct"). For a model whose profile says its
  outputs are bit-exact (GLM-5.3), cold and LMCache-served outputs must also be identical.
  The reference is always cold runs of the same prefix-caching-on engine, never a prefix-caching-off run (seed caveat).
- boundary (seed 004): prompts one token either side of and on chunk boundaries; the external hit must equal what
  vLLM loads from whole chunks (`glm53.chunks.loaded_tokens`): the strict prefix for hybrid models, and L-1 of L on a
  single-group model's full-prompt hit. More than that is the recovery mismatch.
- perf (seed 004's serial study): time to first token and total time, cold against reloaded from LMCache.

Talking (`check_*`) and judging (`judge_*`) are separate: the judges are pure functions over measured samples.
Requests run strictly one after another, so a counter's growth across one request is that request's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from glm53.chunks import loaded_tokens
from glm53.errors import EXIT_USAGE, Glm53Error
from glm53.validate.client import Completion, VllmClient
from glm53.validate.commits import COMMIT_DEADLINE_S, CommitWatch
from glm53.validate.metrics import EXTERNAL_HITS, delta, require
from glm53.validate.progress import Progress
from glm53.validate.prompts import QaPrompt, boundary_lengths, token_id_prompt
from glm53.validate.stats import WelchResult, welch_t_test

SampleT = TypeVar("SampleT")

CHECKS = ("equivalence", "boundary", "perf", "continuations", "mixed")


class CheckResult:
    """What every check returns: the failures it found, one sentence each; it passed when there are none."""

    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Shape:
    """How a check asks: how many tokens to generate, how many top log-probs, streamed or not."""

    max_tokens: int
    logprobs: int | None = None
    stream: bool = False


# Enough tokens for the short answer; only the first token's log-prob is compared.
EQUIVALENCE_SHAPE = Shape(max_tokens=8, logprobs=5)
BOUNDARY_SHAPE = Shape(max_tokens=1)
# Streamed, so the first chunk's arrival is the client-side time to first token.
PERF_SHAPE = Shape(max_tokens=16, stream=True)


@dataclass(frozen=True)
class Target:
    """The server under test, the model to ask, where progress goes, a nonce that keeps this run's salts apart, and
    where to see LMCache commit a prime (None: nowhere, so a reload may race the store; see `glm53.validate.commits`).
    """

    client: VllmClient
    model: str
    progress: Progress
    nonce: str
    commits: CommitWatch | None = None
    # Where reloads come from: `l1`, LMCache's memory; `l2`, its L2 tier (see `reloaded`).
    reload_from: str = "l1"

    @classmethod
    def connect(
        cls,
        client: VllmClient,
        model: str | None,
        progress: Progress,
        commits: CommitWatch | None = None,
        reload_from: str = "l1",
    ) -> Target:
        """Check up front what every check needs: reachable, the model served, the hit counter, dev mode on, and
        LMCache's metrics page when one is given."""
        served = client.model_ids()
        if model is None:
            if not served:
                raise Glm53Error(f"{client.base_url}/v1/models lists no model; wait until vLLM has loaded it")
            model = served[0]
        elif model not in served:
            raise Glm53Error(f"vLLM serves {served}, not {model!r}; pass one of those with --model", EXIT_USAGE)
        require(client.metrics(), EXTERNAL_HITS, client.metrics_source)
        nonce = uuid.uuid4().hex[:12]
        if commits is not None:
            commits.committed(nonce)
        client.reset_prefix_cache(reset_external=False)
        return cls(client, model, progress, nonce, commits, reload_from)

    def salt(self, *parts: object) -> str:
        return "-".join(["glm53-validate", self.nonce, *map(str, parts)])

    def measured(self, prompt: str | list[int], salt: str, shape: Shape) -> tuple[Completion, int]:
        """Send one completion and return it with the LMCache hit tokens it caused (the counter's growth)."""
        before = self.client.metrics()
        completion = self.client.complete(
            self.model,
            prompt,
            max_tokens=shape.max_tokens,
            cache_salt=salt,
            logprobs=shape.logprobs,
            stream=shape.stream,
        )
        hit = delta(before, self.client.metrics(), EXTERNAL_HITS, self.client.metrics_source)
        return completion, int(hit)

    def reloaded(self, prompt: str | list[int], salt: str, shape: Shape) -> tuple[Completion, int]:
        """Reset vLLM's local prefix cache first, so whatever is reused can only come from LMCache; reloading from
        `l2`, LMCache's L1 too: the connector's reset clears the server's L1 managers only (lmcache 0.5.6
        lmcache/v1/distributed/storage_manager.py:1244-1255), so what is reused then comes from its L2 tier."""
        self.client.reset_prefix_cache(reset_external=self.reload_from == "l2")
        return self.measured(prompt, salt, shape)

    def prime(self, prompt: str | list[int], salt: str) -> None:
        """One request that stores the prompt's whole chunks in LMCache, and, with a commit watch, the wait until the
        server can serve them (vLLM answers before that)."""
        completion = self.client.complete(self.model, prompt, max_tokens=1, cache_salt=salt)
        if self.commits is None:
            return
        tokens = completion.prompt_tokens or (len(prompt) if isinstance(prompt, list) else 0)
        chunks = tokens // self.commits.chunk_size
        if chunks == 0:
            return
        waited = self.commits.wait(salt, tokens)
        if waited is None:
            committed = min(self.commits.committed(salt))
            self.progress.step(
                f"LMCache committed {committed:.0f} of the {chunks} chunks stored under {salt} within "
                f"{COMMIT_DEADLINE_S:g} s: the store was dropped"
            )
        else:
            self.progress.step(
                f"LMCache committed the {chunks} chunks stored under {salt} {waited:.2f} s after vLLM answered"
            )


# ---------------------------------------------------------------------------------------------------- equivalence


@dataclass(frozen=True)
class RunSample:
    """One equivalence run: its first-token log-prob, LMCache hit tokens, and whether the answer was right."""

    logprob: float
    hit_tokens: int
    text: str
    correct: bool | None
    prompt_tokens: int | None


@dataclass(frozen=True)
class EquivalenceResult(CheckResult):
    prompt_tokens: int
    alpha: float
    cold: tuple[RunSample, ...]
    cached: tuple[RunSample, ...]
    welch: WelchResult
    failures: tuple[str, ...]


def check_equivalence(
    target: Target, prompt: QaPrompt, runs: int, alpha: float, bit_exact: bool = False
) -> EquivalenceResult:
    def run(condition: str, index: int, completion: Completion, hit: int) -> RunSample:
        if completion.first_logprob is None:
            raise Glm53Error(
                f"vLLM returned no log-probs for a request with logprobs={EQUIVALENCE_SHAPE.logprobs}; "
                "start vLLM without --max-logprobs 0 so validation can compare first-token log-probs",
                EXIT_USAGE,
            )
        target.progress.step(
            f"equivalence: {condition} run {index + 1}/{runs}: log-prob {completion.first_logprob:.4f}, "
            f"LMCache hit {hit} tokens"
        )
        correct = prompt.is_correct(completion.text)
        return RunSample(completion.first_logprob, hit, completion.text, correct, completion.prompt_tokens)

    cold, cached = _cold_then_reloaded(target, "equivalence", prompt.text, EQUIVALENCE_SHAPE, runs, run)
    # The server's own token count where it reports one; the word count of the prompt otherwise.
    tokens = next((s.prompt_tokens for s in cold if s.prompt_tokens), prompt.words)
    return judge_equivalence(cold, cached, alpha, tokens, bit_exact)


# Below this shift of the mean first-token log-prob two conditions are the same for validation, whatever Welch's p says.
# A deterministic engine (the real one on CPU: every run identical) has zero variance, so Welch's t-test calls any
# difference significant, even the 1e-4 that bf16 rounding gives a prefix computed in a separate prefill (measured on
# tiny-dense: -0.2397 cold, -0.2398 mixed, identical outputs). Real defects move it by tenths: the seed-004 fault 0.4,
# the tiny hybrid's lost state 0.2-0.8.
LOGPROB_TOLERANCE = 1e-3


def logprobs_differ(welch: WelchResult, alpha: float) -> bool:
    """Whether two conditions' first-token log-probs differ: significantly, and by more than rounding."""
    return welch.p < alpha and abs(welch.a.mean - welch.b.mean) >= LOGPROB_TOLERANCE


def judge_equivalence(
    cold: Sequence[RunSample],
    cached: Sequence[RunSample],
    alpha: float,
    prompt_tokens: int,
    bit_exact: bool = False,
) -> EquivalenceResult:
    welch = welch_t_test([s.logprob for s in cold], [s.logprob for s in cached])
    failures = []
    if logprobs_differ(welch, alpha):
        failures.append(
            f"the first-token log-probs differ between cold runs (mean {welch.a.mean:.4f}) and runs served from "
            f"LMCache (mean {welch.b.mean:.4f}): Welch p = {welch.p:.3g} < alpha {alpha:g}"
        )
    missed = sum(1 for s in cached if s.hit_tokens <= 0)
    if missed:
        failures.append(
            f"{missed} of {len(cached)} runs after the prefix-cache reset got no LMCache hit; the cache is not "
            "paying off (check the connector's kv-transfer-config and the LMCache server)"
        )
    warm = sum(1 for s in cold if s.hit_tokens > 0)
    if warm:
        failures.append(
            f"{warm} of {len(cold)} cold runs got an LMCache hit despite a unique cache_salt; the cold reference "
            "is not cold (the server ignores cache_salt)"
        )
    wrong_cold, wrong_cached = ([s.text for s in samples if s.correct is False] for samples in (cold, cached))
    if wrong_cold or wrong_cached:
        failures.append(
            f"{len(wrong_cold)} of {len(cold)} cold and {len(wrong_cached)} of {len(cached)} LMCache-served answers "
            f"were wrong (e.g. {(wrong_cold or wrong_cached)[0]!r}); seed 000 requires every answer in both "
            "conditions to be correct"
        )
    failures += bit_exact_failures("equivalence", [s.text for s in cold], [s.text for s in cached], bit_exact)
    return EquivalenceResult(prompt_tokens, alpha, tuple(cold), tuple(cached), welch, tuple(failures))


# ------------------------------------------------------------------------------------------------------- boundary


@dataclass(frozen=True)
class BoundaryRow:
    """One prompt length: what LMCache may serve after priming, and what it did (metrics delta, usage)."""

    prompt_tokens: int
    expected_tokens: int
    hit_tokens: int
    usage_cached_tokens: int | None

    @property
    def served_tokens(self) -> int:
        """The larger of the two measures: a violation visible in either one is a violation."""
        return max(self.hit_tokens, self.usage_cached_tokens or 0)


@dataclass(frozen=True)
class BoundaryResult(CheckResult):
    chunk_size: int
    strict_prefix: bool
    rows: tuple[BoundaryRow, ...]
    failures: tuple[str, ...]


def check_boundary(
    target: Target, chunk_size: int, strict_prefix: bool, id_range: tuple[int, int] = (1000, 30000)
) -> BoundaryResult:
    rows = []
    lengths = boundary_lengths(chunk_size)
    for index, length in enumerate(lengths):
        prompt = token_id_prompt(length, seed=index, id_range=id_range)
        salt = target.salt("boundary", length)
        target.prime(prompt, salt)
        completion, hit = target.reloaded(prompt, salt, BOUNDARY_SHAPE)
        row = BoundaryRow(length, loaded_tokens(length, chunk_size, strict_prefix), hit, completion.cached_tokens)
        target.progress.step(
            f"boundary: {index + 1}/{len(lengths)}: {length}-token prompt, LMCache served {row.served_tokens} "
            f"(expected {row.expected_tokens})"
        )
        rows.append(row)
    return judge_boundary(chunk_size, strict_prefix, rows)


# Said wherever the expectation is L-1 of L, so a reader does not take the missing token for a fault.
_FULL_HIT_NOTE = ", less the last prompt token, which vLLM recomputes on a full-prompt hit"


def judge_boundary(chunk_size: int, strict_prefix: bool, rows: Sequence[BoundaryRow]) -> BoundaryResult:
    should_hit = [row for row in rows if row.expected_tokens > 0]
    if should_hit and all(row.served_tokens == 0 for row in should_hit):
        # One sentence instead of one per length: nothing came back at all, so LMCache is down or not wired in.
        failure = (
            f"LMCache served nothing for any of the {len(should_hit)} prompts that span a whole {chunk_size}-token "
            "chunk; the cache is not paying off (is the LMCache server up and the connector pointed at it?)"
        )
        return BoundaryResult(chunk_size, strict_prefix, tuple(rows), (failure,))
    failures = []
    for row in rows:
        served, length, bound = row.served_tokens, row.prompt_tokens, row.expected_tokens
        note = _FULL_HIT_NOTE if not strict_prefix and bound == length - 1 else ""
        if served > bound and strict_prefix:
            failures.append(
                f"strict-prefix violation: {served} tokens served from LMCache for a {length}-token prompt; at most "
                f"{bound} may be (the last prompt token must be recomputed) — the recovery mismatch of seed 004"
            )
        elif served > bound:
            failures.append(
                f"{served} tokens served from LMCache for a {length}-token prompt; at most {bound} may be (only "
                f"whole {chunk_size}-token chunks are stored{note})"
            )
        elif served < bound:
            failures.append(
                f"only {served} tokens served from LMCache for a {length}-token prompt where {bound} should be "
                f"(whole {chunk_size}-token chunks{note}); the cache is not paying off"
            )
    return BoundaryResult(chunk_size, strict_prefix, tuple(rows), tuple(failures))


# ----------------------------------------------------------------------------------------------------------- perf


@dataclass(frozen=True)
class PerfSample:
    """One timed request: client-side time to first token and total time, its output and its LMCache hit."""

    ttft_seconds: float
    total_seconds: float
    text: str
    hit_tokens: int


@dataclass(frozen=True)
class PerfResult(CheckResult):
    cold: tuple[PerfSample, ...]
    cached: tuple[PerfSample, ...]
    failures: tuple[str, ...]

    @property
    def ttft_speedup(self) -> float:
        """Mean cold TTFT over mean reloaded TTFT: above 1 means LMCache made the first token come sooner."""
        return _mean([s.ttft_seconds for s in self.cold]) / _mean([s.ttft_seconds for s in self.cached])

    @property
    def total_speedup(self) -> float:
        return _mean([s.total_seconds for s in self.cold]) / _mean([s.total_seconds for s in self.cached])

    @property
    def identical_share(self) -> float:
        """How often the i-th reloaded output equalled the i-th cold output token for token."""
        pairs = list(zip(self.cold, self.cached, strict=True))
        return sum(1 for c, r in pairs if c.text == r.text) / len(pairs)


def check_perf(target: Target, prompt: QaPrompt, runs: int, bit_exact: bool = False) -> PerfResult:
    def run(condition: str, index: int, completion: Completion, hit: int) -> PerfSample:
        target.progress.step(
            f"perf: {condition} request {index + 1}/{runs}: TTFT {completion.ttft_seconds * 1000:.1f} ms, "
            f"total {completion.total_seconds * 1000:.1f} ms"
        )
        return PerfSample(completion.ttft_seconds, completion.total_seconds, completion.text, hit)

    cold, cached = _cold_then_reloaded(target, "perf", prompt.text, PERF_SHAPE, runs, run)
    return judge_perf(cold, cached, bit_exact)


def judge_perf(cold: Sequence[PerfSample], cached: Sequence[PerfSample], bit_exact: bool = False) -> PerfResult:
    missed = sum(1 for s in cached if s.hit_tokens <= 0)
    failures = (
        [f"{missed} of {len(cached)} reloaded requests got no LMCache hit, so they did not measure a reload"]
        if missed
        else []
    )
    failures += bit_exact_failures("perf", [s.text for s in cold], [s.text for s in cached], bit_exact)
    return PerfResult(tuple(cold), tuple(cached), tuple(failures))


def bit_exact_failures(check: str, cold: Sequence[str], cached: Sequence[str], bit_exact: bool) -> list[str]:
    """For a bit-exact model any second distinct output at temperature 0 fails; others may vary (seed 000 caveat)."""
    outputs = list(dict.fromkeys([*cold, *cached]))
    if not bit_exact or len(outputs) <= 1:
        return []
    return [
        f"{check}: the profile marks this model's outputs bit-exact, but its {len(cold)} cold and {len(cached)} "
        f"LMCache-served runs gave {len(outputs)} different outputs ({outputs[0]!r}, {outputs[1]!r}, ...); reloading "
        "from LMCache must not change a token"
    ]


def _cold_then_reloaded(
    target: Target,
    check: str,
    prompt: str,
    shape: Shape,
    runs: int,
    record: Callable[[str, int, Completion, int], SampleT],
) -> tuple[list[SampleT], list[SampleT]]:
    """The two conditions both timed checks compare: `runs` cold requests (a unique `cache_salt` each), then one prime,
    then `runs` requests under the primed salt, each after a local prefix-cache reset so reuse comes only from LMCache.
    """
    cold = [record("cold", i, *target.measured(prompt, target.salt(check, "cold", i), shape)) for i in range(runs)]
    target.progress.step(f"{check}: priming LMCache with the prompt")
    salt = target.salt(check, "reloaded")
    target.prime(prompt, salt)
    return cold, [record("reloaded", i, *target.reloaded(prompt, salt, shape)) for i in range(runs)]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
