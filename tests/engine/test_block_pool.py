"""BlockPool and KVCacheManager: exact block ids, ref counts, eviction order, prefix hits."""

import pytest

from engine.block_pool import BlockPool, hash_block_tokens
from engine.kv_cache_manager import KVCacheManager
from engine.request import Request
from engine.sampling_params import SamplingParams

BS = 4


def make_request(request_id: str, tokens: list[int], max_tokens: int = 8) -> Request:
    return Request(request_id, list(tokens), SamplingParams(max_tokens=max_tokens), max_tokens)


def test_allocate_takes_lowest_ids_first_and_free_returns_tail_first():
    pool = BlockPool(6)
    a = pool.allocate(3)
    assert [b.block_id for b in a] == [0, 1, 2]
    assert [b.ref_cnt for b in a] == [1, 1, 1]
    assert pool.num_free_blocks == 3
    pool.free(list(reversed(a)))
    # Free list order: untouched 3,4,5 first, then 2,1,0 (tail freed first).
    assert [b.block_id for b in pool.allocate(6)] == [3, 4, 5, 2, 1, 0]
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_cached_free_block_is_found_until_evicted_lru():
    pool = BlockPool(3)
    b0, b1 = pool.allocate(2)
    h0 = hash_block_tokens(None, [1, 2, 3, 4])
    h1 = hash_block_tokens(h0, [5, 6, 7, 8])
    pool.cache_block(b0, h0)
    pool.cache_block(b1, h1)
    pool.free([b1, b0])
    assert pool.get_cached_block(h0) is b0 and b0.ref_cnt == 0
    pool.touch([b0])  # a hit leaves the free list
    assert b0.ref_cnt == 1 and pool.num_free_blocks == 2
    # Eviction order: block 2 (never used), then b1 (freed earlier than nothing else).
    (x,) = pool.allocate(1)
    assert x.block_id == 2
    (y,) = pool.allocate(1)
    assert y is b1 and pool.get_cached_block(h1) is None  # evicted: hash dropped
    assert pool.get_cached_block(h0) is b0


def test_hash_chains_the_prefix():
    h_a = hash_block_tokens(None, [1, 2, 3, 4])
    h_b = hash_block_tokens(None, [9, 2, 3, 4])
    assert hash_block_tokens(h_a, [5, 6, 7, 8]) != hash_block_tokens(h_b, [5, 6, 7, 8])


def test_prefix_hit_shares_blocks_and_leaves_last_token_to_compute():
    pool = BlockPool(10)
    kv = KVCacheManager(pool, BS)
    a = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert kv.allocate_slots(a, 10)
    assert a.block_ids == [0, 1, 2]
    a.num_computed_tokens = 10
    kv.cache_full_blocks(a)
    assert a.num_registered_blocks == 2

    b = make_request("b", list(range(8)) + [99, 98, 97])
    hits = kv.get_computed_blocks(b)
    assert [h.block_id for h in hits] == [0, 1]
    assert kv.allocate_slots(b, 3, hits)
    assert b.block_ids == [0, 1, 3]
    assert [pool.blocks[i].ref_cnt for i in (0, 1, 2, 3)] == [2, 2, 1, 1]

    # A prompt made only of full cached blocks still computes its last token.
    c = make_request("c", list(range(8)))
    hits_c = kv.get_computed_blocks(c)
    assert [h.block_id for h in hits_c] == [0]

    kv.free(a)
    assert [pool.blocks[i].ref_cnt for i in (0, 1, 2)] == [1, 1, 0]
    assert a.blocks == []


def test_allocate_slots_counts_free_cached_hits_against_capacity():
    pool = BlockPool(3)
    kv = KVCacheManager(pool, BS)
    a = make_request("a", list(range(8)))
    assert kv.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    kv.cache_full_blocks(a)
    kv.free(a)  # blocks 0,1 free but cached; block 2 never used
    b = make_request("b", list(range(8)) + [50] * 8)
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 2
    # b needs 4 blocks: 2 hits (both on the free list) + 2 new, but only 3 exist.
    assert not kv.allocate_slots(b, 8, hits)
    assert pool.num_free_blocks == 3 and b.blocks == []
    assert kv.allocate_slots(b, 4, hits)  # a chunk of 4 fits: 2 hits + 1 new
    assert b.block_ids == [0, 1, 2]


def test_token_ids_slices_prompt_and_output_as_one_list():
    req = make_request("r", [5, 6, 7, 8])
    req.output_token_ids = [1, 2, 3]
    whole = req.prompt_token_ids + req.output_token_ids
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 2):
            assert req.token_ids(start, end) == whole[start:end], (start, end)


def test_block_ids_follow_the_blocks_through_hits_growth_and_free():
    pool = BlockPool(8, enable_caching=True)
    mgr = KVCacheManager(pool, block_size=BS)
    a = make_request("a", list(range(10)))
    assert mgr.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    mgr.cache_full_blocks(a)
    b = make_request("b", list(range(9)) + [99])
    hits = mgr.get_computed_blocks(b)
    assert mgr.allocate_slots(b, 10 - 4 * len(hits), hits)
    b.num_computed_tokens = 10
    assert mgr.allocate_slots(b, 3)  # grows into a fourth block
    for req in (a, b):
        assert req.block_ids == [blk.block_id for blk in req.blocks], req.request_id
    assert b.block_ids[:2] == a.block_ids[:2] and len(b.block_ids) == 4
    mgr.free(b)
    assert b.blocks == [] and b.block_ids == []
