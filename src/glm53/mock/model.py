"""The mock "model": a tokenizer, deterministic text, first-token log-probs with run-to-run noise, simulated compute.

The validation protocol compares first-token log-prob distributions cold versus served from LMCache, so that is what
this model gets right: the most likely first token's log-prob is a prompt-dependent base near the seed's -0.93 plus
Gaussian noise (sd 0.05) drawn from an RNG seeded by `--seed` and the request counter — seed 000 notes GLM-5.3-Flash's
outputs are not bit-exact — and the distribution is the same cold or cached. Profiles whose greedy runs reproduce
exactly (GLM-5.3, seed 001) get no noise. A document-QA prompt ("... the X is V. ... what is the X? ...") is answered
by quoting V, so the validation's answer check has a real answer to judge, cold or cached alike. The injected
recovery-mismatch fault shifts the log-prob of requests whose whole prompt came from the cache, as a state restored for
L tokens while L-1 were credited would.
Compute is a sleep proportional to the tokens actually prefilled, so a cache hit measurably cuts TTFT, but quickly.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

FIRST_TOKEN_BASE_LOGPROB = -0.93
BASE_SPREAD = 0.04  # prompt-dependent offset range around the base
NOISE_SD = 0.05
# The first-token log-prob shift of a request whose full prompt was restored from the cache under the fault.
RECOVERY_MISMATCH_SHIFT = -0.4
# The corrupt-restore fault: the first-token log-prob shift, and the token that makes the restored "state" another
# prefix's (so the words differ from the first on).
CORRUPT_RESTORE_SHIFT = -0.5
WRONG_STATE_TOKEN = -1
FOLLOWING_TOKEN_LOGPROB = -0.08
# The runners-up at each position (what `logprobs=N` lists after the chosen token), each less likely than the last:
# at the first position from just below the chosen token's log-prob, later from where the little left fits.
ALTERNATIVES = 5
ALTERNATIVE_STEP = 0.6
FOLLOWING_ALTERNATIVE_LOGPROB = -3.5

_VOCABULARY = (
    *("the", "answer", "is", "in", "section", "paragraph", "document", "states", "that", "according", "to"),
    *("report", "value", "total", "year", "revenue", "growth", "customer", "contract", "clause", "date", "amount"),
    *("party", "agreement", "term", "notice", "because", "therefore", "however", "which"),
)


def _hash_int(*parts: object) -> int:
    text = "\x1f".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def tokenize(text: str) -> list[int]:
    """One token per whitespace-separated word (the mocks' tokenizer rule), as a stable 32-bit id."""
    return [_hash_int(word) & 0xFFFFFFFF for word in text.split()]


def prompt_fingerprint(tokens: Sequence[int]) -> int:
    return _hash_int(*tokens)


@dataclass(frozen=True)
class Generation:
    """One completion: its words, the log-prob of each, and at each position the most likely other words."""

    words: tuple[str, ...]
    logprobs: tuple[float, ...]
    alternatives: tuple[tuple[tuple[str, float], ...], ...]  # per position: (word, log-prob), most likely first

    @property
    def first_alternatives(self) -> tuple[tuple[str, float], ...]:
        return self.alternatives[0] if self.alternatives else ()


def _runners_up(fingerprint: int, position: int, chosen: str, below: float) -> tuple[tuple[str, float], ...]:
    """`ALTERNATIVES` distinct words other than `chosen`, at log-probs `below`, `below - step`, ..."""
    start = _hash_int(fingerprint, "alt", position) % len(_VOCABULARY)
    rotated = (*_VOCABULARY[start:], *_VOCABULARY[:start])
    others = [word for word in dict.fromkeys(rotated) if word != chosen][:ALTERNATIVES]
    return tuple((word, below - ALTERNATIVE_STEP * i) for i, word in enumerate(others))


_QUESTION = re.compile(r"what is the ([\w ]{1,80}?)\?", re.IGNORECASE)


def extract_answer(text: str) -> str | None:
    """The value a document states for the subject of its last "what is the X?" question, if it states one."""
    questions = _QUESTION.findall(text)
    if not questions:
        return None
    stated = re.findall(rf"the {re.escape(questions[-1])} is (\S+?)[.,;]?(?:\s|$)", text, re.IGNORECASE)
    return stated[0] if stated else None


def first_token_logprob(fingerprint: int, seed: int, counter: int, shift: float, noise_sd: float = NOISE_SD) -> float:
    base = FIRST_TOKEN_BASE_LOGPROB + BASE_SPREAD * ((fingerprint % 1001) / 1000 - 0.5)
    noise = random.Random(f"{seed}:{counter}").gauss(0.0, noise_sd) if noise_sd else 0.0
    return min(base + noise + shift, -1e-3)


def generate(
    tokens: Sequence[int],
    max_tokens: int,
    seed: int,
    counter: int,
    shift: float = 0.0,
    noise_sd: float = NOISE_SD,
    answer: str | None = None,
) -> Generation:
    """Deterministic words from the prompt's hash (led by `answer` when the prompt asked a question it answers);
    only the first token's log-prob carries the per-request noise."""
    fingerprint = prompt_fingerprint(tokens)
    filler = (_VOCABULARY[_hash_int(fingerprint, i) % len(_VOCABULARY)] for i in range(max_tokens))
    words = (*([answer] if answer else []), *filler)[:max_tokens]
    first = first_token_logprob(fingerprint, seed, counter, shift, noise_sd)
    logprobs = (first, *(FOLLOWING_TOKEN_LOGPROB for _ in words[1:]))[: len(words)]
    alternatives = tuple(
        _runners_up(fingerprint, i, word, first - ALTERNATIVE_STEP if i == 0 else FOLLOWING_ALTERNATIVE_LOGPROB)
        for i, word in enumerate(words)
    )
    return Generation(words, logprobs, alternatives)


@dataclass(frozen=True)
class ComputeCost:
    """Simulated seconds of compute: prefill per uncached prompt token, decode per generated token."""

    prefill_seconds_per_token: float
    decode_seconds_per_token: float

    def prefill(self, uncached_tokens: int) -> float:
        return uncached_tokens * self.prefill_seconds_per_token

    def decode(self, generated_tokens: int) -> float:
        return generated_tokens * self.decode_seconds_per_token
