"""vLLM's own (local, GPU) prefix cache in the engine stand-in: whole scheduler blocks, least recently used out first.

A block is named by a chained hash of the cache_salt and every token up to its end, so a block names a whole prefix
and a different salt never matches, as vLLM's block hashes do. Only which blocks exist matters; there is no data.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(salt: str, tokens: Sequence[int], block: int, limit: int | None = None) -> list[str]:
    """One hash per whole `block`-token prefix of `tokens[:limit]`; hash i covers the salt and tokens[: (i+1)*block]."""
    end = len(tokens) if limit is None else min(limit, len(tokens))
    digest = hashlib.blake2b(salt.encode(), digest_size=16).digest()
    hashes = []
    for start in range(0, end - end % block, block):
        chunk = ",".join(map(str, tokens[start : start + block])).encode()
        digest = hashlib.blake2b(digest + chunk, digest_size=16).digest()
        hashes.append(digest.hex())
    return hashes


class LocalPrefixCache:
    """At most `capacity` blocks; a hit refreshes the blocks it used."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def longest_prefix(self, hashes: Sequence[str]) -> int:
        """How many leading blocks are cached."""
        count = 0
        for name in hashes:
            if name not in self._blocks:
                break
            self._blocks.move_to_end(name)
            count += 1
        return count

    def put(self, hashes: Sequence[str]) -> tuple[list[int], list[str]]:
        """Cache the blocks; (indexes of the ones that were not cached before, the blocks evicted to make room)."""
        new = [index for index, name in enumerate(hashes) if name not in self._blocks]
        for name in hashes:
            self._blocks[name] = None
            self._blocks.move_to_end(name)
        evicted = []
        while len(self._blocks) > self.capacity:
            evicted.append(self._blocks.popitem(last=False)[0])
        return new, evicted

    def clear(self) -> None:
        self._blocks.clear()
