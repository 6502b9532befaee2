"""ChainIndex: the approximate index as root chains answers as the per-block LRU does, touching only new blocks."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from extproc.kvcache.chain_index import ChainIndex
from extproc.kvcache.index import Chain
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId
from tests.support.clock import FakeClock

E1, E2, E3 = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
MASK64 = 2**64 - 1


def chained(n: int, salt: int = 0, parent: int = 0) -> list[BlockHash]:
    """``n`` blocks of one prompt: each hash commits to its parent's, as vLLM's do."""
    out, h = [], parent
    for i in range(n):
        h = hash((h, salt, i)) & MASK64
        out.append(BlockHash(h))
    return out


def test_a_long_prompt_matches_in_full_and_its_extension_adds_only_new_blocks() -> None:
    index = ChainIndex()
    turn1 = chained(6000)
    turn2 = turn1 + chained(40, salt=1, parent=turn1[-1])
    index.store_sync(E1, turn1, ttl_s=600)
    assert index.match_sync(turn2, [E1, E2]) == {E1: 6000}
    index.store_sync(E1, turn2, ttl_s=600)
    assert index.match_sync(turn2, [E1]) == {E1: 6040}
    assert index.entries(E1) == 6040
    assert len(index._eps[E1].ends) == 1  # the first turn's end was superseded by the second's


def test_a_block_expires_with_the_latest_expiring_store_through_it() -> None:
    clock = FakeClock()
    index = ChainIndex(clock=clock)
    long_guess = chained(10)
    index.store_sync(E1, long_guess, ttl_s=600)
    index.store_sync(E1, long_guess + chained(5, salt=2, parent=long_guess[-1]), ttl_s=2)  # a burst mark on top
    clock.now += 3
    assert index.match_sync(long_guess + chained(5, salt=2, parent=long_guess[-1]), [E1]) == {E1: 10}
    clock.now += 600
    assert index.match_sync(long_guess, [E1]) == {}
    assert index.entries(E1) == 0 and index.blocks() == 0


def test_capacity_evicts_the_least_recent_tail_first_and_keeps_shared_prefixes() -> None:
    index = ChainIndex(capacity_blocks=8)
    system = chained(3)
    a = system + chained(4, salt=1, parent=system[-1])
    b = system + chained(4, salt=2, parent=system[-1])
    index.store_sync(E1, a)
    index.store_sync(E1, b)  # 11 blocks for 8: a's last three go
    assert index.match_sync(a, [E1]) == {E1: 4}
    assert index.match_sync(b, [E1]) == {E1: 7}
    assert index.entries(E1) == 8


def test_only_root_chains_are_taken() -> None:
    index = ChainIndex()
    with pytest.raises(ValueError, match="from their first"):
        asyncio.run(index.store(E1, chained(2), chain=Chain.after(BlockHash(7))))


def test_clear_forgets_an_endpoint_and_its_share_of_the_blocks() -> None:
    index = ChainIndex()
    blocks = chained(5)
    index.store_sync(E1, blocks)
    index.store_sync(E2, blocks[:3])
    assert index.blocks() == 5
    index.clear_sync(E1)
    assert index.match_sync(blocks, [E1, E2]) == {E2: 3}
    assert index.blocks() == 3 and index.endpoints() == frozenset({E2})


def _prompts(rng: random.Random) -> list[list[BlockHash]]:
    """Root chains over a small random tree: shared prefixes, branches and extensions of each other."""
    trunk = chained(4, salt=rng.randrange(1 << 30))
    prompts = [trunk]
    for _ in range(10):
        base = rng.choice(prompts)
        cut = rng.randint(0, len(base))
        parent = base[cut - 1] if cut else 0
        prompts.append(base[:cut] + chained(rng.randint(1, 5), salt=rng.randrange(1 << 30), parent=parent))
    return prompts


@pytest.mark.parametrize("seed", range(40))
def test_random_root_chain_operations_agree_with_the_per_block_lru(seed: int) -> None:
    """With one TTL for every store (as the router uses it), ChainIndex answers every match as MemoryPrefixIndex."""
    rng = random.Random(seed)
    clock = FakeClock()
    capacity = rng.choice([None, 3, 5, 8, 13])
    ttl = rng.choice([None, 10.0])
    ours, reference = (
        ChainIndex(capacity_blocks=capacity, clock=clock),
        MemoryPrefixIndex(capacity_blocks=capacity, clock=clock),
    )
    prompts = _prompts(rng)
    endpoints = [E1, E2, E3]
    for step in range(200):
        op = rng.random()
        if op < 0.45:
            e, prompt = rng.choice(endpoints), rng.choice(prompts)
            prompt = prompt[: rng.randint(1, len(prompt))]
            ours.store_sync(e, prompt, ttl_s=ttl)
            reference.store_sync(e, prompt, ttl_s=ttl)
        elif op < 0.5:
            e = rng.choice(endpoints)
            ours.clear_sync(e)
            reference.clear_sync(e)
        elif op < 0.6:
            clock.now += rng.choice([0.5, 3.0, 7.0])
        else:
            query, asked = rng.choice(prompts), rng.sample(endpoints, rng.randint(0, 3))
            assert ours.match_sync(query, asked) == reference.match_sync(query, asked), f"step {step}"
    for e in endpoints:  # every held block is matchable: nothing is orphaned or double counted
        held = sum(1 for h in set().union(*prompts) if h in ours._eps[e].parent) if e in ours._eps else 0
        assert held == ours.entries(e) <= (capacity if capacity is not None else math.inf)


def test_hashes_that_are_no_chain_are_kept_up_to_where_they_stop_being_one() -> None:
    index = ChainIndex()
    index.store_sync(E1, [BlockHash(5), BlockHash(5), BlockHash(6)])  # a block after itself: only the first is one
    assert index.entries(E1) == 1 and index.match_sync([BlockHash(5)], [E1]) == {E1: 1}
