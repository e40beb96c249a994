"""The paged KV cache: allocation, LRU eviction and chained prefix hashes."""

from __future__ import annotations

from engine_sim.kv import BLOCK_SIZE, BlockPool, KVCacheManager


def _manager(blocks: int = 8) -> KVCacheManager:
    return KVCacheManager(BlockPool(blocks, enable_caching=True))


def test_allocation_is_by_whole_blocks_and_usage_counts_referenced_blocks() -> None:
    kv = _manager(8)
    assert kv.allocate_slots("a", 17)
    assert kv.num_blocks_of("a") == 2
    assert kv.pool.usage == 2 / 8
    assert not kv.allocate_slots("b", 7 * BLOCK_SIZE)  # 7 blocks needed, 6 free: no partial change
    assert kv.num_blocks_of("b") == 0
    kv.forget("a")
    assert kv.pool.usage == 0.0


def test_freed_full_blocks_are_hit_by_a_request_with_the_same_prefix() -> None:
    kv = _manager(8)
    tokens = list(range(40))  # two full blocks and a partial one
    assert kv.allocate_slots("a", 40)
    kv.cache_computed("a", tokens, 40)
    kv.forget("a")
    hits, hit_tokens = kv.computed_blocks("b", tokens + [99])
    assert hit_tokens == 32 and len(hits) == 2
    assert kv.allocate_slots("b", 41, hits)
    assert kv.num_blocks_of("b") == 3


def test_the_last_prompt_token_is_always_recomputed() -> None:
    kv = _manager(8)
    tokens = list(range(32))  # exactly two blocks
    kv.allocate_slots("a", 32)
    kv.cache_computed("a", tokens, 32)
    kv.forget("a")
    _, hit_tokens = kv.computed_blocks("b", tokens)
    assert hit_tokens == 16


def test_hashes_chain_so_a_matching_block_after_a_different_prefix_misses() -> None:
    kv = _manager(8)
    first = list(range(32))
    kv.allocate_slots("a", 32)
    kv.cache_computed("a", first, 32)
    kv.forget("a")
    other = [1000 + i for i in range(16)] + first[16:] + [5]
    _, hit_tokens = kv.computed_blocks("b", other)
    assert hit_tokens == 0


def test_free_cached_blocks_are_evicted_least_recently_used_first() -> None:
    kv = _manager(4)
    old, new = list(range(16)), list(range(100, 116))
    for rid, tokens in (("old", old), ("new", new)):
        kv.allocate_slots(rid, 16)
        kv.cache_computed(rid, tokens, 16)
        kv.forget(rid)
    # Two never-used blocks go first, then "old"'s block; "new" survives.
    assert kv.allocate_slots("c", 3 * BLOCK_SIZE)
    assert kv.computed_blocks("x", old + [1])[1] == 0
    assert kv.computed_blocks("y", new + [1])[1] == 16


def test_disabled_caching_never_hits() -> None:
    kv = KVCacheManager(BlockPool(4, enable_caching=False))
    tokens = list(range(33))
    kv.allocate_slots("a", 33)
    kv.cache_computed("a", tokens, 33)
    kv.forget("a")
    assert kv.computed_blocks("b", tokens) == ([], 0)
