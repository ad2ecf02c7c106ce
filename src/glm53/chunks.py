"""Chunk-size arithmetic: what LMCache can store and serve for a prompt, and which chunk size a server settles on.

Pure functions over integers. LMCache stores only whole chunks, so the tail of every prompt is recomputed; for hybrid
(Mamba / linear-attention) models vLLM also reserves the last prompt token for the logits (strict-prefix lookup), so a
prompt of L tokens can be served for at most floor((L-1)/C)*C tokens. The seeds' numbers are the tests: 5040 tokens at
C = 1024 -> 4096, at C = 256 -> 4864; 8507 tokens at C = 1152 with the strict-prefix rule -> 8064.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from glm53.errors import Glm53Error


@dataclass(frozen=True)
class Coverage:
    """How much of one prompt LMCache can serve at a given chunk size."""

    prompt_tokens: int
    chunk_size: int
    strict_prefix: bool
    served_tokens: int

    @property
    def share(self) -> float:
        return self.served_tokens / self.prompt_tokens

    @property
    def recomputed_tokens(self) -> int:
        return self.prompt_tokens - self.served_tokens


def require_positive(value: int, what: str) -> int:
    """`value` if it is a positive integer, else a one-line error naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise Glm53Error(f"{what} must be a positive integer, got {value!r}")
    return value


def _is_decimal(text: str) -> bool:
    # Bounded length: int() refuses more than 4300 digits, and no token count needs more than 18.
    return text.isascii() and text.isdigit() and len(text) <= 18


def parse_positive(text: str, what: str) -> int:
    """A positive integer given as text (a flag, a file line), or a one-line error naming `what` and the text."""
    stripped = text.strip()
    if not _is_decimal(stripped) or int(stripped) <= 0:
        raise Glm53Error(f"{what} must be a positive integer, got {text!r}")
    return int(stripped)


def parse_non_negative(text: str, what: str) -> int:
    """A whole number >= 0 given as text, or a one-line error naming `what` and the text."""
    stripped = text.strip()
    if not _is_decimal(stripped):
        raise Glm53Error(f"{what} must be a whole number >= 0, got {text!r}")
    return int(stripped)


def parse_groups(text: str) -> tuple[int, ...]:
    """Comma-separated tokens_per_block values as the geometry line lists them (`1152,1152,1152,1152,1152,0`)."""
    values = []
    for item in text.replace("[", "").replace("]", "").split(","):
        stripped = item.strip()
        if not _is_decimal(stripped):
            raise Glm53Error(f"groups must be comma-separated non-negative integers like 1152,1152,0, got {text!r}")
        values.append(int(stripped))
    return validate_groups(values)


def served_tokens(prompt_tokens: int, chunk_size: int, strict_prefix: bool) -> int:
    """Tokens of an L-token prompt that LMCache can serve: whole chunks, minus the reserved last token if strict."""
    require_positive(prompt_tokens, "prompt length")
    require_positive(chunk_size, "chunk size")
    lookup_tokens = prompt_tokens - 1 if strict_prefix else prompt_tokens
    return (lookup_tokens // chunk_size) * chunk_size


def loaded_tokens(prompt_tokens: int, chunk_size: int, strict_prefix: bool) -> int:
    """Tokens vLLM loads from LMCache (its external hit) for an L-token prompt LMCache holds in whole chunks.

    What LMCache serves, except on a full-prompt hit (single-group models at L = k*C), where the connector loads one
    token fewer so vLLM recomputes the last one for the logits: 255 of 256. Strict-prefix lookups never hit in full.
    """
    # lmcache 0.5.6 lmcache/integration/vllm/lmcache_mp_connector.py:1341-1346: `if ret == len(request.all_token_ids):
    # need_to_load = max(0, need_to_load - 1)`; vllm 0.33.0 resolves LMCacheMPConnector to that class
    # (vllm/distributed/kv_transfer/kv_connector/v1/lmcache_mp_connector.py:1185-1217).
    served = served_tokens(prompt_tokens, chunk_size, strict_prefix)
    return served - 1 if served == prompt_tokens else served


def coverage(prompt_tokens: int, chunk_size: int, strict_prefix: bool = False) -> Coverage:
    return Coverage(prompt_tokens, chunk_size, strict_prefix, served_tokens(prompt_tokens, chunk_size, strict_prefix))


def validate_groups(groups: Sequence[int]) -> tuple[int, ...]:
    """The groups' tokens_per_block, checked: at least one positive value, none negative (0 marks a scratch group)."""
    if not groups:
        raise Glm53Error("groups must list at least one tokens_per_block value, e.g. 1152,1152,1152,1152,1152,0")
    for value in groups:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Glm53Error(f"tokens_per_block values must be non-negative integers, got {value!r}")
    if not any(groups):
        raise Glm53Error("every group has tokens_per_block 0 (all scratch); there is nothing LMCache could cache")
    return tuple(groups)


def required_alignment(groups: Sequence[int]) -> int:
    """The least common multiple of the positive tokens_per_block values: what every chunk size must be a multiple of.

    This is also the connector's `scheduler_block_size`; scratch groups (0) do not constrain it.
    """
    return math.lcm(*(g for g in validate_groups(groups) if g > 0))


def round_up(value: int, alignment: int) -> int:
    """The smallest positive multiple of `alignment` that is >= `value` (a value of 0 or less gives `alignment`)."""
    require_positive(alignment, "alignment")
    return max(1, -(-value // alignment)) * alignment


def negotiate_chunk_size(configured_min: int, groups: Sequence[int]) -> int:
    """The chunk size a negotiating LMCache server settles on: the smallest multiple of the alignment >= the minimum."""
    require_positive(configured_min, "configured minimum chunk size")
    return round_up(configured_min, required_alignment(groups))


def is_valid_chunk_size(chunk_size: int, groups: Sequence[int]) -> bool:
    """True when `chunk_size` is a positive multiple of every positive group block size."""
    return chunk_size > 0 and chunk_size % required_alignment(groups) == 0


# What one chunk costs beyond its tokens, in tokens of prefill it would have to save to pay for itself: LMCache hashes
# one key per whole chunk (lmcache 0.5.6 lmcache/v1/multiprocess/token_hasher.py:222-229, a rolling hash per
# `chunk_size` tokens), looks each key up, and keeps one stored object with its metadata per chunk. Halving the chunk
# doubles all three per token. The figure is an assumption, not a measurement: `--chunk-overhead-tokens` changes it.
DEFAULT_CHUNK_OVERHEAD_TOKENS = 16


@dataclass(frozen=True)
class Recommendation:
    """One candidate chunk size over a workload: what it serves, what its chunks cost, and whether it was validated."""

    chunk_size: int
    served_tokens: int
    total_tokens: int
    prompts_with_hit: int
    prompts: int
    chunks: int  # whole chunks over all prompts: one key hashed, looked up and stored for each
    chunk_overhead_tokens: int
    validated: bool

    @property
    def served_share(self) -> float:
        return self.served_tokens / self.total_tokens

    @property
    def overhead_tokens(self) -> int:
        return self.chunks * self.chunk_overhead_tokens

    @property
    def net_tokens(self) -> int:
        """Served tokens minus what the chunks cost: the figure sizes are ranked by after validation."""
        return self.served_tokens - self.overhead_tokens


def candidate_chunk_sizes(
    groups: Sequence[int], longest_prompt: int, limit: int = 16, validated: Iterable[int] = ()
) -> list[int]:
    """Multiples of the alignment up to the longest prompt (at most `limit`, at least one) and the valid `validated`."""
    alignment = required_alignment(groups)
    count = max(1, min(limit, longest_prompt // alignment))
    multiples = {alignment * k for k in range(1, count + 1)}
    return sorted(multiples | {size for size in validated if is_valid_chunk_size(size, groups)})


def recommend(
    prompt_lengths: Iterable[int],
    groups: Sequence[int],
    strict_prefix: bool,
    limit: int = 16,
    validated: Sequence[int] = (),
    chunk_overhead_tokens: int = DEFAULT_CHUNK_OVERHEAD_TOKENS,
) -> list[Recommendation]:
    """Every valid chunk size ranked best first: validated sizes first, then by net tokens, then the smaller size.

    Validated sizes lead because a size nobody ran may break what the arithmetic cannot see (the seeds validated
    GLM-5.3 at 256 and 1024, never at 64). Within each class the net tokens decide: a smaller chunk serves more of each
    prompt's tail but pays per-chunk lookups and metadata on every token, so the smallest size no longer wins by
    default. Ties go to the smaller chunk, which wastes less of each tail.
    """
    lengths = [require_positive(length, "prompt length") for length in prompt_lengths]
    if not lengths:
        raise Glm53Error("the prompt-length distribution is empty; give at least one prompt length")
    if (
        isinstance(chunk_overhead_tokens, bool)
        or not isinstance(chunk_overhead_tokens, int)
        or chunk_overhead_tokens < 0
    ):
        raise Glm53Error(f"the per-chunk overhead must be a whole number of tokens >= 0, got {chunk_overhead_tokens!r}")
    total = sum(lengths)
    results = []
    for chunk in candidate_chunk_sizes(groups, max(lengths), limit, validated):
        served = [served_tokens(length, chunk, strict_prefix) for length in lengths]
        chunks = sum(length // chunk for length in lengths)
        hits = sum(1 for s in served if s > 0)
        results.append(
            Recommendation(
                chunk, sum(served), total, hits, len(lengths), chunks, chunk_overhead_tokens, chunk in validated
            )
        )
    return sorted(results, key=lambda r: (not r.validated, -r.net_tokens, r.chunk_size))
