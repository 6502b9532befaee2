"""Ingest owns which purges also drop our approximate guesses (a real purge does; a retried one does not)."""

from __future__ import annotations

from extproc.kvcache.events import AllBlocksCleared, EventBatch
from extproc.kvcache.index import IndexUnavailable
from extproc.kvcache.ingest import Ingest, Outcome
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId

E = EndpointId("10.0.0.1:8000")
HASHES = [BlockHash(1), BlockHash(2)]


class FlakyIndex(MemoryPrefixIndex):
    """A precise index whose clears fail while ``down``."""

    down = True

    async def clear(self, endpoint: EndpointId) -> None:
        if self.down:
            raise IndexUnavailable("down")
        await super().clear(endpoint)


class SkippingIndex(MemoryPrefixIndex):
    """The leases' fenced view as a replica that is not the writer sees it: every write skipped."""

    async def clear(self, endpoint: EndpointId) -> bool:  # type: ignore[override]
        return False


async def test_a_real_purge_drops_guesses_even_while_the_precise_index_is_down() -> None:
    approx = MemoryPrefixIndex()
    await approx.store(E, HASHES)
    ingest = Ingest(FlakyIndex(), lambda _e: None, approx=approx)
    assert await ingest.purge(E, "engine restart") is Outcome.WRITE_LOST
    assert await approx.match(HASHES, [E]) == {}


async def test_a_purge_that_retries_an_index_failure_keeps_the_guesses() -> None:
    precise, approx = FlakyIndex(), MemoryPrefixIndex()
    await precise.store(E, HASHES)
    ingest = Ingest(precise, lambda _e: None, approx=approx)
    assert await ingest.purge(E, "engine restart") is Outcome.WRITE_LOST
    await approx.store(E, HASHES)  # guessed while the precise index was down
    precise.down = False
    assert await ingest.apply(E, EventBatch(ts=1.0, events=())) is Outcome.APPLIED  # the retried purge lands
    assert await precise.match(HASHES, [E]) == {}
    assert await approx.match(HASHES, [E]) == {E: 2}


async def test_an_all_blocks_cleared_drops_guesses_too() -> None:
    precise, approx = MemoryPrefixIndex(), MemoryPrefixIndex()
    await approx.store(E, HASHES)
    ingest = Ingest(precise, lambda _e: None, approx=approx)
    assert await ingest.apply(E, EventBatch(ts=1.0, events=(AllBlocksCleared(),))) is Outcome.APPLIED
    assert await approx.match(HASHES, [E]) == {} and ingest.status(E).cold


async def test_a_purge_another_replica_writes_is_skipped_but_still_drops_our_guesses() -> None:
    approx = MemoryPrefixIndex()
    await approx.store(E, HASHES)
    ingest = Ingest(SkippingIndex(), lambda _e: None, approx=approx)
    assert await ingest.purge(E, "reconnected") is Outcome.SKIPPED
    assert await approx.match(HASHES, [E]) == {} and ingest.status(E).cold
