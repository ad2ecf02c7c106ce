"""The engine stand-in's local prefix cache evicts in vLLM 0.33's order (glm53.mock.local_cache cites the code):
a request's blocks are freed in reverse, so its tail goes first and a shared prefix outlives the tails; a hit takes
blocks out of the eviction queue; eviction takes the blocks freed longest ago first."""

from __future__ import annotations

from glm53.mock.local_cache import LocalPrefixCache, block_hashes

BLOCK = 4


def prompt(first: int, blocks: int, prefix: tuple[int, ...] = ()) -> list[int]:
    """`blocks` whole blocks of tokens: `prefix`, then tokens counting up from `first`."""
    return [*prefix, *range(first, first + blocks * BLOCK - len(prefix))]


def test_a_second_prompt_evicts_the_first_prompts_tail_and_keeps_its_leading_block() -> None:
    """Capacity 4, A and B 3 blocks each: B takes the free block and A's blocks 2 then 1; A's block 0 stays a hit."""
    a = block_hashes("", prompt(0, 3), BLOCK)
    b = block_hashes("", prompt(100, 3), BLOCK)
    cache = LocalPrefixCache(capacity=4)
    assert cache.put(a) == ([0, 1, 2], [])
    assert cache.put(b) == ([0, 1, 2], [a[2], a[1]])  # BlockRemoved goes out in this order
    assert cache.longest_prefix(a) == 1
    assert cache.longest_prefix(a[1:]) == 0 and cache.longest_prefix(a[2:]) == 0
    assert cache.longest_prefix(b) == 3
    assert len(cache) == 4


def test_a_prefix_shared_by_two_prompts_outlives_their_tails() -> None:
    shared = tuple(range(900, 900 + BLOCK))
    a = block_hashes("", prompt(0, 3, shared), BLOCK)
    b = block_hashes("", prompt(100, 3, shared), BLOCK)
    c = block_hashes("", prompt(200, 2), BLOCK)
    assert a[0] == b[0] and a[1] != b[1]
    cache = LocalPrefixCache(capacity=4)
    cache.put(a)
    assert cache.put(b) == ([1, 2], [a[2]])  # B's hit on the shared block is not B's to evict
    assert cache.put(c) == ([0, 1], [a[1], b[2]])
    assert cache.longest_prefix(a) == 1 and cache.longest_prefix(b) == 2
    assert cache.put(c) == ([], [])  # all hits: nothing new, nothing evicted
    assert cache.longest_prefix(b) == 2


def test_a_hit_takes_its_blocks_out_of_the_queue_before_the_request_allocates() -> None:
    """The shared block is at the queue's head when B arrives; B's own allocation takes the next one instead."""
    cache = LocalPrefixCache(capacity=2)
    cache.put(["p"])
    cache.put(["q"])
    assert cache.put(["p", "b1"]) == ([1], ["q"])
    assert cache.longest_prefix(["p", "b1"]) == 2


def test_eviction_takes_the_blocks_freed_longest_ago_first() -> None:
    cache = LocalPrefixCache(capacity=2)
    cache.put(["x"])
    cache.put(["y"])
    cache.put(["x"])  # a hit: x is freed again, after y
    assert cache.put(["z"]) == ([0], ["y"])
    assert cache.longest_prefix(["x"]) == 1


def test_a_lookup_alone_does_not_refresh_blocks() -> None:
    """vLLM touches hit blocks when it allocates the request's slots; here that is the request's `put`."""
    cache = LocalPrefixCache(capacity=2)
    cache.put(["x"])
    cache.put(["y"])
    assert cache.longest_prefix(["x"]) == 1
    assert cache.put(["z"]) == ([0], ["x"])


def test_a_prompt_longer_than_the_cache_keeps_its_leading_blocks_and_evicts_nothing_of_its_own() -> None:
    cache = LocalPrefixCache(capacity=2)
    cache.put(["q"])
    assert cache.put(["a0", "a1", "a2"]) == ([0, 1], ["q"])
    assert cache.longest_prefix(["a0", "a1", "a2"]) == 2 and len(cache) == 2


def test_without_prefix_caching_nothing_is_cached_so_no_block_is_stored_or_removed() -> None:
    """vllm 0.33.0 vllm/v1/core/kv_cache_manager.py:800-801: no caching, no BlockStored (and nothing to evict)."""
    cache = LocalPrefixCache(capacity=0)
    assert cache.put(["a0", "a1"]) == ([], [])
    assert cache.longest_prefix(["a0"]) == 0 and len(cache) == 0
