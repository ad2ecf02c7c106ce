"""The chunk-size handshake of both LMCache generations, as a pure function of the engine's cache groups.

Released 0.5.6 keeps its configured `--chunk-size` and the connector refuses to start when that size is not a multiple
of every cacheable group's tokens_per_block. Newer ("negotiating") upstream treats `--chunk-size` as a minimum and
rounds it up to the least common multiple of the positive groups, logging the change once. Scratch groups (0) never
constrain either generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from glm53.chunks import negotiate_chunk_size, required_alignment

GENERATIONS = ("released", "negotiating")


@dataclass(frozen=True)
class Handshake:
    """The server's answer to one engine registration: the chunk size to use, or the refusal text."""

    chunk_size: int
    alignment: int
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.error is None


def refusal(chunk_size: int, groups: Sequence[int]) -> str | None:
    """The released connector's error for the first group `chunk_size` is not a multiple of, or None if it fits."""
    for index, block in enumerate(groups):
        if block > 0 and chunk_size % block:
            return (
                f"LMCache chunk size {chunk_size} must be a multiple of engine group {index} tokens_per_block {block}"
            )
    return None


def handshake(generation: str, configured_chunk_size: int, groups: Sequence[int]) -> Handshake:
    alignment = required_alignment(groups)
    if generation == "negotiating":
        return Handshake(negotiate_chunk_size(configured_chunk_size, groups), alignment)
    return Handshake(configured_chunk_size, alignment, refusal(configured_chunk_size, groups))
