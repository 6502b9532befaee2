"""In-memory backend specifics beyond the contract suite: reclaiming memory, capacity edge cases."""

from __future__ import annotations

import pytest

from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId

E1, E2 = EndpointId("a:1"), EndpointId("b:1")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def hs(n: int, base: int = 0) -> list[BlockHash]:
    return [BlockHash(base + i) for i in range(n)]


async def test_expired_entries_are_reclaimed_on_later_stores() -> None:
    clock = Clock()
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
    assert index._blocks == {}  # no orphaned block records


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
