"""The hot set a copy must not evict: blocks hit since fewer than ``capacity`` blocks were stored."""

import asyncio

import pytest

from extproc.backends.hot_blocks import HotBlocks
from extproc.kvcache.gate import ObservedWrites
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId

A, B = EndpointId("a:1"), EndpointId("b:1")


def hashes(start: int, n: int) -> list[BlockHash]:
    return [BlockHash(i) for i in range(start, start + n)]


def test_unknown_capacity_is_not_tracked() -> None:
    hot = HotBlocks(lambda e: None)
    hot.routed(A, hashes(0, 10), cached_blocks=10, placed=False)
    assert hot.hot(A) is None


def test_only_hits_are_hot_and_a_prefix_counts_once() -> None:
    hot = HotBlocks(lambda e: 100)
    prefix = hashes(0, 20)
    hot.routed(A, prefix + hashes(1000, 5), cached_blocks=0, placed=False)  # cold: stored, nothing hot yet
    assert hot.hot(A) == 0
    for user in range(3):  # three users of the same prefix, each with their own question
        hot.routed(A, prefix + hashes(2000 + 10 * user, 5), cached_blocks=20, placed=False)
    assert hot.hot(A) == 20
    assert hot.hot(B) == 0


@pytest.mark.parametrize(
    ("stored_after", "still_hot"),
    [(99, 20), (100, 0)],
    ids=["lru-has-not-cycled-past-it", "capacity-stored-since-its-last-hit"],
)
def test_a_hit_cools_once_capacity_blocks_were_stored_since(stored_after: int, still_hot: int) -> None:
    hot = HotBlocks(lambda e: 100)
    hot.routed(
        A, hashes(0, 20) + hashes(500, 21), cached_blocks=20, placed=False
    )  # its 21 stored blocks count as older
    hot.routed(A, hashes(10_000, stored_after), cached_blocks=0, placed=False)
    assert hot.hot(A) == still_hot


def test_a_placed_prefix_is_hot_at_once() -> None:
    hot = HotBlocks(lambda e: 100)
    hot.routed(A, hashes(0, 20), cached_blocks=0, placed=True)
    assert hot.hot(A) == 20


def test_forget_drops_the_endpoint() -> None:
    hot = HotBlocks(lambda e: 100)
    hot.routed(A, hashes(0, 20), cached_blocks=20, placed=False)
    hot.cleared(A)
    assert hot.hot(A) == 0


def test_hits_count_the_requests_that_reused_a_block_while_it_stayed_hot() -> None:
    hot = HotBlocks(lambda e: 100)
    tools = hashes(0, 20)
    hot.routed(A, tools + hashes(1000, 5), cached_blocks=0, placed=True)  # placed: hot, but not a hit
    assert hot.hits(A, tools[-1]) == 0
    for session in range(3):  # three sessions extend the shared tools, each with its own context
        hot.routed(A, tools + hashes(2000 + 10 * session, 5), cached_blocks=20, placed=False)
    assert (hot.hits(A, tools[-1]), hot.hits(A, BlockHash(2000)), hot.hits(B, tools[-1])) == (3, 0, 0)
    hot.routed(A, hashes(5000, 100), cached_blocks=0, placed=False)  # capacity stored since: cooled, forgotten
    assert hot.hits(A, tools[-1]) == 0


def test_an_evicted_block_is_not_hot() -> None:
    hot = HotBlocks(lambda e: 100)
    prefix = hashes(0, 20)
    hot.routed(A, prefix, cached_blocks=0, placed=True)
    hot.routed(A, prefix + hashes(1000, 5), cached_blocks=20, placed=False)
    hot.removed(A, prefix[15:])  # the engine's BlockRemoved: the tail of the prefix is gone
    hot.removed(B, prefix)  # another endpoint's eviction changes nothing here
    assert (hot.hot(A), hot.hits(A, prefix[14]), hot.hits(A, prefix[19])) == (15, 1, 0)


def test_the_writes_keep_the_hot_set_to_what_the_engine_holds() -> None:
    """The mechanism of issue 13's last cascade, pinned: the benchmark resets every cache between runs
    (``AllBlocksCleared``). Before, the hot sets outlived the reset: the next run's 16 groups (108 blocks each on
    4 backends of 600) read 600 hot blocks everywhere from the 7th placement on, a tie, and the momentary estimate
    chose their homes (5/4/4/3). A clear now forgets the endpoint, so each run places on its own hot sets."""
    index = MemoryPrefixIndex()
    hot = HotBlocks(lambda e: 600)
    writes = ObservedWrites(index, [hot])
    first_run = [hashes(1000 * g, 108) for g in range(4)]  # four groups homed on A

    async def go() -> None:
        for group in first_run:
            hot.routed(A, group, cached_blocks=0, placed=True)
            await writes.store(A, group)
        await writes.remove(A, first_run[0][100:])  # evicted: not hot, and gone from the index
        assert (await index.match(first_run[0], [A]))[A] == 100
        assert hot.hot(A) == 4 * 108 - 8
        await writes.clear(A)  # the cache reset between runs

    asyncio.run(go())
    assert hot.hot(A) == 0 and hot.hits(A, first_run[1][-1]) == 0
    hot.routed(A, first_run[1], cached_blocks=0, placed=True)  # the next run's first home there
    assert hot.hot(A) == 108
