"""The block pool and KV manager: LRU free queue, reverse freeing, prefix reuse, eviction and reset events."""

from __future__ import annotations

from tests.sim.factories import make_request, make_scheduler, run_to_completion
from vllm_sim.events import Cleared, Removed, StoredRun
from vllm_sim.hashing import BlockHasher
from vllm_sim.kv_cache import BlockPool, KVCacheManager


def test_null_block_is_never_allocated_and_usage_counts_usable_blocks() -> None:
    pool = BlockPool(5, 4, enable_caching=True, record_events=False)
    assert pool.free_order() == [1, 2, 3, 4]
    assert pool.allocate(2) == [1, 2]
    assert pool.usage() == 0.5


def test_freed_blocks_join_the_tail_in_reverse_so_tails_are_evicted_first() -> None:
    sched = make_scheduler(num_blocks=9, block_size=4)
    req = make_request(list(range(100, 112)), output_len=1)  # 12 prompt tokens -> blocks 1, 2, 3
    sched.add(req)
    run_to_completion(sched)
    # never-used blocks stay at the head, then the request's blocks from its last to its first
    assert sched.kv.pool.free_order() == [4, 5, 6, 7, 8, 3, 2, 1]


def test_second_identical_request_reuses_cached_blocks_but_not_the_last_token() -> None:
    sched = make_scheduler(block_size=4)
    tokens = list(range(100, 112))  # exactly 3 full blocks
    first = make_request(tokens, output_len=1)
    sched.add(first)
    run_to_completion(sched)
    second = make_request(tokens, output_len=1)
    sched.add(second)
    sched.schedule()
    assert second.num_cached_tokens == 8  # the last token is always recomputed: 2 of 3 blocks
    assert second.block_ids[:2] == first_blocks(sched, tokens)[:2]


def first_blocks(sched, tokens):  # type: ignore[no-untyped-def]
    hashes = sched._hasher.hash_tokens(tokens)
    return [sched.kv.pool.cached_block(h) for h in hashes]


def test_prefix_differing_in_first_token_gets_no_hit() -> None:
    sched = make_scheduler(block_size=4)
    sched.add(make_request(list(range(100, 120)), output_len=1))
    run_to_completion(sched)
    other = make_request([7, *range(101, 120)], output_len=1)
    sched.add(other)
    sched.schedule()
    assert other.num_cached_tokens == 0


def test_block_stored_runs_cover_prompt_then_generated_blocks() -> None:
    sched = make_scheduler(block_size=4)
    req = make_request(list(range(100, 110)), output_len=7)  # 10 prompt + 7 output = 17 tokens
    sched.add(req)
    run_to_completion(sched)
    stored = [e for e in sched.kv.pool.take_events() if isinstance(e, StoredRun)]
    assert [len(e.block_hashes) for e in stored] == [
        2,
        1,
        1,
    ]  # prompt 2 blocks, then blocks 3 and 4 as decode fills
    assert stored[0].parent_block_hash is None
    assert stored[1].parent_block_hash == stored[0].block_hashes[-1]
    assert stored[2].token_ids == req.all_token_ids[12:16]
    assert stored[0].extra_keys == [None, None]


def test_eviction_emits_one_removed_per_cached_block_in_lru_order() -> None:
    sched = make_scheduler(num_blocks=5, block_size=4, max_model_len=32)
    a = make_request(list(range(100, 108)), output_len=1)  # blocks 1, 2 cached; free queue 3, 4, 2, 1
    sched.add(a)
    run_to_completion(sched)
    a_hashes = [h for e in sched.kv.pool.take_events() if isinstance(e, StoredRun) for h in e.block_hashes]
    b = make_request(list(range(200, 212)), output_len=1)  # 3 blocks: 3, 4 and a's tail block 2
    sched.add(b)
    run_to_completion(sched)
    removed = [e.block_hash for e in sched.kv.pool.take_events() if isinstance(e, Removed)]
    assert removed == [a_hashes[1]]
    c = make_request(list(range(300, 316)), output_len=1)  # all 4 blocks: evicts the rest, oldest first
    sched.add(c)
    run_to_completion(sched)
    removed = [e.block_hash for e in sched.kv.pool.take_events() if isinstance(e, Removed)]
    assert removed[0] == a_hashes[0] and len(removed) == 4


def test_reset_refused_while_blocks_in_use_then_clears() -> None:
    sched = make_scheduler(block_size=4)
    req = make_request(list(range(100, 110)), output_len=3)
    sched.add(req)
    step = sched.schedule()
    assert not sched.kv.pool.reset()
    sched.update(step, 0.0)
    run_to_completion(sched)
    sched.kv.pool.take_events()
    assert sched.kv.pool.reset()
    assert sched.kv.pool.take_events() == [Cleared()]
    again = make_request(list(range(100, 110)), output_len=1)
    sched.add(again)
    sched.schedule()
    assert again.num_cached_tokens == 0


def test_allocation_counts_evictable_hit_blocks_against_free_space() -> None:
    pool = BlockPool(4, 4, enable_caching=True, record_events=False)
    kv = KVCacheManager(pool, max_model_len=64)
    req = make_request(list(range(12)), output_len=1)
    req.block_hashes = BlockHasher("sha256", "seed", 4).hash_tokens(req.all_token_ids)
    assert not kv.allocate_slots(req, 16, [])  # 4 blocks needed, 3 usable
    assert kv.allocate_slots(req, 12, [])
    assert pool.num_free == 0
