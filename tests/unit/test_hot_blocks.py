"""The hot set a copy must not evict: blocks hit since fewer than ``capacity`` blocks were stored."""

import asyncio
import itertools
import math
import random
from collections import OrderedDict

import pytest

from extproc.backends.hot_blocks import HotBlocks
from extproc.kvcache.gate import ObservedWrites
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId, Touch

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


class PerBlock:
    """The hot set by its definition, block by block: each hit refreshes every block of its path (the root last:
    the most recently useful) and counts one more hit on its first ``cached`` blocks; the least recent go first,
    every block hit ``capacity`` stored blocks ago or more, then the oldest beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.stored = capacity, 0
        self.last_hit: OrderedDict[BlockHash, int] = OrderedDict()  # oldest first
        self.counts: dict[BlockHash, int] = {}
        self.entered: dict[BlockHash, tuple[float, int]] = {}  # (when it became hot, its count then)

    def routed(self, hashes: list[BlockHash], cached: int, placed: bool, now: float = 0.0) -> None:
        self.stored += max(len(hashes) - cached, 0)
        path = hashes if placed else hashes[:cached]
        for i in reversed(range(len(path))):
            self.last_hit[path[i]] = self.stored
            self.last_hit.move_to_end(path[i])
            self.counts[path[i]] = self.counts.get(path[i], 0) + (i < cached)
            self.entered.setdefault(path[i], (now, self.counts[path[i]]))
        while self.last_hit:
            oldest, at = next(iter(self.last_hit.items()))
            if self.stored - at < self.capacity and len(self.last_hit) <= self.capacity:
                break
            del self.last_hit[oldest]
            del self.counts[oldest]
            del self.entered[oldest]

    def hit_gap_s(self, block: BlockHash, now: float) -> float:
        if block not in self.entered or self.counts[block] == self.entered[block][1]:
            return math.inf
        since, base = self.entered[block]
        return (now - since) / (self.counts[block] - base)


def _paths(rng: random.Random) -> list[list[BlockHash]]:
    """Prompts over a random tree: shared prefixes, branches, extensions of each other (distinct block ids)."""
    ids = itertools.count(1)
    paths = [[BlockHash(next(ids)) for _ in range(rng.randint(1, 6))]]
    for _ in range(12):
        base = rng.choice(paths)
        cut = rng.randint(0, len(base))
        paths.append(base[:cut] + [BlockHash(next(ids)) for _ in range(rng.randint(1, 8))])
    return paths


def _request(rng: random.Random, paths: list[list[BlockHash]]) -> tuple[list[BlockHash], int, bool]:
    """A random request on one of ``paths``: its blocks, how many were cached, whether it was placed."""
    path = rng.choice(paths)
    path = path[: rng.randint(1, len(path))]
    return path, rng.randint(0, len(path)), rng.random() < 0.3


@pytest.mark.parametrize("seed", range(40))
def test_the_tree_of_runs_keeps_what_the_per_block_definition_keeps(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([4, 9, 16, 40])
    now = [0.0]
    ours, model = HotBlocks(lambda e: capacity, clock=lambda: now[0]), PerBlock(capacity)
    paths = _paths(rng)
    universe = sorted(set().union(*paths))
    for step in range(150):
        now[0] = float(step)
        path, cached, placed = _request(rng, paths)
        ours.routed(A, path, cached, placed=placed)
        model.routed(path, cached, placed, now[0])
        assert ours.hot(A) == len(model.last_hit), f"step {step}"
        assert [ours.hits(A, b) for b in universe] == [model.counts.get(b, 0) for b in universe], f"step {step}"
        now[0] += 0.5
        gaps = [ours.hit_gap_s(A, b) for b in universe]
        assert gaps == [model.hit_gap_s(b, now[0]) for b in universe], f"step {step}"


@pytest.mark.parametrize(
    ("placed", "hit_times", "expected_s"),
    [
        (True, [1.0, 2.0], 4.0 / 2),  # placed at 0, two hits since: 4 s over two
        (False, [3.0], 4.0 / 1),  # first hit at 0 (it became hot then), one hit since
        (False, [], math.inf),  # hit once, never again: no gap measured
    ],
    ids=["placed-then-hit-twice", "hit-then-once-more", "hit-once"],
)
def test_the_hit_gap_is_the_time_since_it_became_hot_over_the_hits_since(
    placed: bool, hit_times: list[float], expected_s: float
) -> None:
    now = [0.0]
    hot = HotBlocks(lambda e: 100, clock=lambda: now[0])
    prefix = hashes(0, 20)
    hot.routed(A, prefix, cached_blocks=0 if placed else 20, placed=placed)
    for at in hit_times:
        now[0] = at
        hot.routed(A, prefix + hashes(1000 + int(at) * 10, 5), cached_blocks=20, placed=False)
    now[0] = 4.0
    assert hot.hit_gap_s(A, prefix[-1]) == expected_s
    assert hot.hit_gap_s(A, BlockHash(1000)) == math.inf  # stored, never hit
    assert hot.hit_gap_s(B, prefix[-1]) == math.inf


def test_an_evicted_block_takes_the_rest_of_its_paths_along() -> None:
    hot = HotBlocks(lambda e: 100)
    shared, a, b = hashes(0, 10), hashes(100, 5), hashes(200, 5)
    hot.routed(A, shared + a, cached_blocks=15, placed=False)
    hot.routed(A, shared + b, cached_blocks=15, placed=False)
    hot.removed(A, [shared[7]])  # a hole at 7: nothing after it can be hit
    assert (hot.hot(A), hot.hits(A, shared[6]), hot.hits(A, a[0]), hot.hits(A, b[-1])) == (7, 2, 0, 0)
    hot.routed(A, shared + a, cached_blocks=7, placed=False)  # what still hits
    assert (hot.hot(A), hot.hits(A, shared[6])) == (7, 3)


@pytest.mark.parametrize("seed", range(20))
def test_two_replicas_that_hear_each_other_keep_the_hot_sets_one_replica_keeps(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([4, 9, 16, 40])
    now = [0.0]
    outbox: dict[str, list[Touch]] = {"x": [], "y": []}
    one = HotBlocks(lambda e: capacity, clock=lambda: now[0])
    x = HotBlocks(lambda e: capacity, clock=lambda: now[0], on_touch=outbox["x"].append)
    y = HotBlocks(lambda e: capacity, clock=lambda: now[0], on_touch=outbox["y"].append)
    paths = _paths(rng)
    universe = sorted(set().union(*paths))
    for step in range(150):
        now[0] = float(step)
        endpoint, (path, cached, placed) = rng.choice([A, B]), _request(rng, paths)
        one.routed(endpoint, path, cached, placed=placed)
        here, there, sent = (x, y, outbox["x"]) if rng.random() < 0.5 else (y, x, outbox["y"])
        here.routed(endpoint, path, cached, placed=placed)
        assert len(sent) == 1, "each routed request is told once"
        there.heard(sent.pop())
        for replica in (x, y):
            for e in (A, B):
                assert replica.hot(e) == one.hot(e), f"step {step}"
                assert [replica.hits(e, b) for b in universe] == [one.hits(e, b) for b in universe], f"step {step}"
                assert [replica.hit_gap_s(e, b) for b in universe] == [one.hit_gap_s(e, b) for b in universe]
    assert outbox == {"x": [], "y": []}, "a heard touch is not told again"


def test_a_touch_says_what_was_hit_placed_and_stored() -> None:
    told: list[Touch] = []
    hot = HotBlocks(lambda e: 100 if e == A else None, on_touch=told.append)
    prefix, question = hashes(0, 20), hashes(500, 4)
    hot.routed(A, prefix + question, cached_blocks=0, placed=True)  # a new prefix placed: all of it hot
    hot.routed(A, prefix + hashes(600, 4), cached_blocks=20, placed=False)  # a hit on it
    hot.routed(B, prefix, cached_blocks=0, placed=True)  # capacity unknown: nothing kept, nothing told
    assert told == [Touch(A, prefix + question, 0, 24), Touch(A, prefix, 20, 4)]
