"""The feed's view of the indexes: which purges also drop our approximate guesses."""

from __future__ import annotations

import pytest

from extproc.kvcache.feed import _ClearsBoth
from extproc.kvcache.index import IndexUnavailable
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId

E = EndpointId("10.0.0.1:8000")
HASHES = [BlockHash(1), BlockHash(2)]


class DownIndex(MemoryPrefixIndex):
    async def clear(self, endpoint: EndpointId) -> None:
        raise IndexUnavailable("down")


async def test_a_real_purge_drops_guesses_even_while_the_precise_index_is_down() -> None:
    approx = MemoryPrefixIndex()
    await approx.store(E, HASHES)
    view = _ClearsBoth(DownIndex(), approx, index_retry=lambda e: False)
    with pytest.raises(IndexUnavailable):
        await view.clear(E)
    assert await approx.match(HASHES, [E]) == {}


async def test_a_purge_that_retries_an_index_failure_keeps_the_guesses() -> None:
    precise, approx = MemoryPrefixIndex(), MemoryPrefixIndex()
    await precise.store(E, HASHES)
    await approx.store(E, HASHES)
    await _ClearsBoth(precise, approx, index_retry=lambda e: True).clear(E)
    assert await precise.match(HASHES, [E]) == {}
    assert await approx.match(HASHES, [E]) == {E: 2}
