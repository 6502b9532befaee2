"""MirroredIndex: local guesses always answer; the shared copy adds what other replicas routed."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence

from extproc.kvcache.index import IndexUnavailable
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.mirrored_index import MirroredIndex
from extproc.types import BlockHash, EndpointId

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")
H = [BlockHash(i) for i in range(1, 5)]


class Broken(MemoryPrefixIndex):
    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s = delay_s

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
            return {A: 99}
        raise IndexUnavailable("down")

    async def store(self, endpoint: EndpointId, hashes: Sequence[BlockHash], **_: object) -> None:
        raise IndexUnavailable("down")


async def test_a_sibling_replica_sees_what_the_other_routed() -> None:
    shared = MemoryPrefixIndex()
    one = MirroredIndex(MemoryPrefixIndex(), shared, shared_timeout_s=0.1)
    two = MirroredIndex(MemoryPrefixIndex(), shared, shared_timeout_s=0.1)
    await one.store(A, H[:3], ttl_s=2.0)
    await two.store(B, H, ttl_s=2.0)
    assert await two.match(H, [A, B]) == {A: 3, B: 4}


async def test_a_down_or_slow_shared_copy_leaves_the_local_guesses() -> None:
    for shared in (Broken(), Broken(delay_s=0.5)):
        index = MirroredIndex(MemoryPrefixIndex(), shared, shared_timeout_s=0.05)
        await index.store(B, H)  # the shared write fails quietly
        assert await index.match(H, [A, B]) == {B: 4}
