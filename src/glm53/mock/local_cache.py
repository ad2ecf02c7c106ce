"""vLLM's own (local, GPU) prefix cache in the engine stand-in: whole scheduler blocks, evicted in vLLM's order.

vLLM evicts from the head of its free-block queue: blocks freed longest ago first and, of one request's blocks, the
tail before the prefix, so a prefix shared by many prompts outlives their tails (`LocalPrefixCache.put` cites the code).

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
    """At most `capacity` blocks, kept in the order vLLM's free-block queue would evict them (head first).

    Requests run one at a time here (the engine's lock), so between requests every cached block is free, i.e. an
    eviction candidate in vLLM's queue, and `put` plays one request's whole life in the block pool at once.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        # The free queue: the first key is evicted next.
        self._blocks: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def longest_prefix(self, hashes: Sequence[str]) -> int:
        """How many leading blocks are cached; a lookup only, the request's `put` refreshes them."""
        # vllm 0.33.0 vllm/v1/core/kv_cache_manager.py:596-604: the hit blocks are touched when the request's slots
        # are allocated, not when they are looked up; `put` does both.
        count = 0
        for name in hashes:
            if name not in self._blocks:
                break
            count += 1
        return count

    def put(self, hashes: Sequence[str]) -> tuple[list[int], list[str]]:
        """One request's blocks through vLLM's block pool: touch the cached ones, allocate the rest, free all.

        Returns (indexes of the blocks that were not cached before, the blocks evicted to make room, in eviction
        order). A request never evicts its own blocks.
        """
        # vllm 0.33.0 vllm/v1/core/kv_cache_planning.py:1510-1559: vLLM refuses to start when a max_model_len request
        # cannot fit the (overridden) pool; the stand-in serves it anyway and caches its first `capacity` blocks, the
        # rest being neither stored nor evicted.
        held = list(hashes[: self.capacity])
        new = [index for index, name in enumerate(held) if name not in self._blocks]
        # vllm 0.33.0 vllm/v1/core/block_pool.py:792-807: a hit (touch) takes the block out of the free queue.
        for name in held:
            self._blocks.pop(name, None)
        # vllm 0.33.0 vllm/v1/core/block_pool.py:706-729: new blocks come off the free queue's head (popleft_n), and
        # a cached block taken that way is evicted.
        evicted = []
        while len(self._blocks) + len(held) > self.capacity:
            evicted.append(self._blocks.popitem(last=False)[0])
        # vllm 0.33.0 vllm/v1/core/single_type_kv_cache_manager.py:591-599: a finished request's blocks are freed in
        # reverse, and block_pool.py:816-847 appends cached blocks to the queue's tail in that order (append_n), so
        # among one request's blocks the last is evicted first and a shared prefix outlives its tails
        # (kv_cache_utils.py:258-274, FreeKVCacheBlockQueue's eviction order).
        for name in reversed(held):
            self._blocks[name] = None
        return new, evicted

    def clear(self) -> None:
        self._blocks.clear()
