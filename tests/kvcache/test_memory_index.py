"""In-memory backend specifics beyond the contract suite: reclaiming memory, capacity edge cases."""

from __future__ import annotations

import pytest

from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId
from tests.support.clock import FakeClock

E1, E2 = EndpointId("a:1"), EndpointId("b:1")


def hs(n: int, base: int = 0) -> list[BlockHash]:
    return [BlockHash(base + i) for i in range(n)]


async def test_expired_entries_are_reclaimed_on_later_stores() -> None:
    clock = FakeClock(0.0)
    index = MemoryPrefixIndex(clock=clock)
    await index.store(E1, hs(100), ttl_s=5)
    assert index.entries(E1) == 100
    clock.now = 10
    await index.store(E1, hs(3, base=1000), ttl_s=5)
    assert index.entries(E1) == 3
    clock.now = 20
    await index.store(E2, hs(1))
    assert index.endpoints() == {E1, E2}  # E1 reclaimed only when E1 is next written


async def test_clear_and_remove_release_memory() -> None:
    index = MemoryPrefixIndex()
    await index.store(E1, hs(10))
    await index.store(E2, hs(10))
    await index.remove(E1, hs(10))
    assert index.entries(E1) == 0 and index.endpoints() == {E2}
    await index.clear(E2)
    assert index.endpoints() == frozenset()
    assert index.blocks() == 0  # no orphaned block records


async def test_zero_capacity_keeps_nothing() -> None:
    index = MemoryPrefixIndex(capacity_blocks=0)
    await index.store(E1, hs(3))
    assert await index.match(hs(3), [E1]) == {}
    assert index.entries(E1) == 0


def test_negative_capacity_is_rejected() -> None:
    with pytest.raises(ValueError):
        MemoryPrefixIndex(capacity_blocks=-1)


async def test_capacity_function_is_read_on_every_store() -> None:
    caps: dict[EndpointId, int | None] = {E1: None}
    index = MemoryPrefixIndex(capacity_blocks=lambda e: caps.get(e))
    await index.store(E1, hs(10))
    caps[E1] = 4  # discovered later: applies from the next store
    await index.store(E1, hs(1, base=100))
    assert index.entries(E1) == 4


class ReferenceIndex:
    """The documented semantics, naively: per endpoint an ordered {hash: expires_at}, oldest first."""

    def __init__(self, capacity: int | None, clock: FakeClock) -> None:
        self.capacity, self.clock = capacity, clock
        self.held: dict[EndpointId, dict[int, float]] = {}

    def store(self, e: EndpointId, hashes: list[BlockHash], ttl: float | None) -> None:
        d = self.held.setdefault(e, {})
        exp = float("inf") if ttl is None else self.clock.now + ttl
        for h in reversed(hashes):
            d.pop(h, None)
            d[h] = exp
        while self.capacity is not None and len(d) > self.capacity:
            del d[next(iter(d))]

    def remove(self, e: EndpointId, hashes: list[BlockHash]) -> None:
        for h in hashes:
            self.held.get(e, {}).pop(h, None)

    def match(self, hashes: list[BlockHash], eps: list[EndpointId]) -> dict[EndpointId, int]:
        out = {}
        for e in eps:
            n = 0
            for h in hashes:
                if self.held.get(e, {}).get(h, -1.0) <= self.clock.now:
                    break
                n += 1
            if n:
                out[e] = n
        return out


@pytest.mark.parametrize("capacity", [None, 5])
@pytest.mark.parametrize("seed", range(12))
async def test_random_ttl_capacity_operations_agree_with_a_reference(seed: int, capacity: int | None) -> None:
    import random

    rng = random.Random(seed)
    clock = FakeClock(0.0)
    index = MemoryPrefixIndex(capacity_blocks=capacity, clock=clock)
    ref = ReferenceIndex(capacity, clock)
    universe = hs(10, base=2**64 - 10)  # up to 2**64-1
    eps = [EndpointId(f"e{i}:1") for i in range(4)]
    ttls = [None, 1.0, 5.0, 10.0] if seed % 2 else [10.0]  # odd seeds mix TTLs ("late" entries)
    for _ in range(300):
        op, e = rng.random(), rng.choice(eps)
        picked = rng.sample(universe, rng.randint(0, 5))
        if op < 0.4:
            ttl = rng.choice(ttls)
            await index.store(e, picked, ttl_s=ttl)
            ref.store(e, picked, ttl)
        elif op < 0.5:
            await index.remove(e, picked)
            ref.remove(e, picked)
        elif op < 0.55:
            await index.clear(e)
            ref.held.pop(e, None)
        elif op < 0.65:
            clock.now += rng.choice([1.0, 3.0, 6.0])
        else:
            query = universe[: rng.randint(0, 10)]
            asked = rng.sample(eps, rng.randint(0, 4))
            assert await index.match(query, asked) == ref.match(query, asked)
