"""A bounded store of prefix keys with sizes: the mock LMCache server's L1, and the mock vLLM's local prefix cache.

Only sizes are stored (the mock has no tensors), which is all the budget, eviction and hit accounting need. Policies
mirror the real server's `--eviction-policy` choices: `LRU` evicts the least recently used chunks of anyone;
`IsolatedLRU` keeps one LRU list per cache_salt, so a writer can only evict its own chunks (a tenant cannot flush
another's); `noop` never evicts, so writes that do not fit are dropped. The vLLM mock keeps its local prefix cache
in an `LRU` store of scheduler blocks, each of size 1 against a capacity counted in blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

EVICTION_POLICIES = ("LRU", "IsolatedLRU", "noop")


@dataclass(frozen=True)
class StoreResult:
    """What one store request did: chunks newly written, chunks evicted to make room, chunks dropped for lack of it."""

    written: int
    evicted: int
    dropped: int


class ChunkStore:
    """Chunk keys -> bytes, most recently used last, bounded by `capacity_bytes`."""

    def __init__(self, capacity_bytes: int, policy: str) -> None:
        if policy not in EVICTION_POLICIES:
            raise ValueError(f"unknown eviction policy {policy!r}")
        self.capacity_bytes = capacity_bytes
        self.policy = policy
        self.used_bytes = 0
        self._entries: OrderedDict[str, tuple[str, int]] = OrderedDict()  # key -> (salt, size)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def longest_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys are stored; those entries become the most recently used."""
        count = 0
        for key in keys:
            if key not in self._entries:
                break
            self._entries.move_to_end(key)
            count += 1
        return count

    def put(self, salt: str, keys: Sequence[str], chunk_bytes: int) -> StoreResult:
        written = evicted = dropped = 0
        for key in keys:
            if key in self._entries:
                self._entries.move_to_end(key)
                continue
            evicted += self._make_room(salt, chunk_bytes)
            if self.used_bytes + chunk_bytes > self.capacity_bytes:
                dropped += 1
                continue
            self._entries[key] = (salt, chunk_bytes)
            self.used_bytes += chunk_bytes
            written += 1
        return StoreResult(written, evicted, dropped)

    def _make_room(self, salt: str, needed: int) -> int:
        if self.policy == "noop" or needed > self.capacity_bytes:
            return 0
        evicted = 0
        while self.used_bytes + needed > self.capacity_bytes:
            victim = self._victim(salt)
            if victim is None:
                break
            self.used_bytes -= self._entries.pop(victim)[1]
            evicted += 1
        return evicted

    def _victim(self, salt: str) -> str | None:
        """The least recently used key this writer may evict (any key for LRU, its own salt's for IsolatedLRU)."""
        for key, (owner, _) in self._entries.items():
            if self.policy == "LRU" or owner == salt:
                return key
        return None

    def clear(self) -> int:
        """Drop everything; returns the number of chunks removed."""
        removed = len(self._entries)
        self._entries.clear()
        self.used_bytes = 0
        return removed
