"""Ingest without transport: filtering, ordering, self-check trust, purges, index failures."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

import pytest

from extproc.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
    decode_batch,
)
from extproc.kvcache.index import Chain, IndexUnavailable
from extproc.kvcache.ingest import Ingest, Outcome
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.types import BlockHash, EndpointId, EngineBlockHash, HashScheme
from tests.support.golden import golden_case, golden_event_batch, golden_event_hashes

E = EndpointId("10.0.0.1:8000")
GOLDEN_PAYLOAD = golden_event_batch()
TOKENS = golden_case("doc_summary")["token_ids"]
HASHES = golden_event_hashes("doc_summary")


def stored(first: int, n: int, *, parent: bool = True, **kw: object) -> BlockStored:
    """doc_summary blocks [first, first+n) as vLLM would announce them."""
    fields: dict[str, object] = {
        "medium": "GPU", "group_idx": 0, "kind": "full_attention", "extra_keys": (None,) * n, **kw
    }  # fmt: skip
    return BlockStored(
        block_hashes=tuple(EngineBlockHash(h) for h in HASHES[first : first + n]),
        parent=EngineBlockHash(HASHES[first - 1]) if first and parent else None,
        token_ids=tuple(TOKENS[first * 16 : (first + n) * 16]),
        block_size=16,
        **fields,  # type: ignore[arg-type]
    )


def batch(*events: KvEvent) -> EventBatch:
    return EventBatch(ts=1.0, events=tuple(events), dp_rank=0)


DEFAULT_SCHEME = HashScheme()  # sha256, seed unset, block size 16: how the golden data was made


def make(scheme: HashScheme | None = DEFAULT_SCHEME) -> tuple[Ingest, MemoryPrefixIndex]:
    index = MemoryPrefixIndex()
    return Ingest(index, lambda _e: scheme), index


def blocks(n: int) -> list[BlockHash]:
    return [BlockHash(h) for h in HASHES[:n]]


async def held(index: MemoryPrefixIndex) -> int:
    return (await index.match(blocks(len(HASHES)), [E])).get(E, 0)


async def test_golden_batch_applies_in_order() -> None:
    ingest, index = make()
    payload = decode_batch(GOLDEN_PAYLOAD)
    # Without the trailing AllBlocksCleared: stores 0-4, then removes 4.
    await ingest.apply(E, EventBatch(payload.ts, payload.events[:3], payload.dp_rank))
    assert await held(index) == 4
    st = ingest.status(E)
    assert (st.trusted, st.cold, ingest.counters.selfchecks) == (True, False, 1)
    assert ingest.counters.selfcheck_mismatches == 0
    await ingest.apply(E, payload)  # the whole batch ends with AllBlocksCleared
    assert await held(index) == 0
    assert ingest.status(E).cold
    assert ingest.counters.clears == 1


async def test_selfcheck_mismatch_makes_the_endpoint_untrusted_until_a_check_passes() -> None:
    ingest, index = make(HashScheme(seed="0"))  # router configured with another seed than the engines
    await ingest.apply(E, batch(stored(0, 3)))
    assert not ingest.status(E).trusted
    assert ingest.counters.selfcheck_mismatches == 1
    assert await held(index) == 0  # untrusted stores are skipped
    await ingest.apply(E, batch(stored(3, 2)))  # parent set: cannot check, still untrusted
    assert ingest.counters.untrusted_skips == 2
    ingest.scheme_for = lambda _e: HashScheme()  # configuration fixed
    await ingest.apply(E, batch(stored(0, 3)))
    assert ingest.status(E).trusted
    assert await held(index) == 3


async def test_selfcheck_catches_block_size_drift() -> None:
    ingest, _ = make(HashScheme(block_size=32))
    await ingest.apply(E, batch(stored(0, 2)))
    assert not ingest.status(E).trusted


async def test_selfcheck_skipped_when_not_reproducible() -> None:
    ingest, _ = make(HashScheme(seed="0"))  # would mismatch if checked
    await ingest.apply(E, batch(stored(0, 2, extra_keys=(("tenant-a",), None))))  # salted
    await ingest.apply(E, batch(stored(0, 2, lookahead=True)))
    await ingest.apply(E, batch(stored(1, 2)))  # has a parent
    assert ingest.status(E).trusted and ingest.counters.selfchecks == 0
    ingest2, _ = make(None)  # no scheme known for the endpoint
    await ingest2.apply(E, batch(stored(0, 2)))
    assert ingest2.counters.selfchecks == 0
    ingest3, _ = make(HashScheme(algo="xxhash"))  # not reproducible here
    await ingest3.apply(E, batch(stored(0, 2)))
    assert ingest3.counters.selfchecks == 0 and ingest3.status(E).trusted


async def test_only_gpu_full_attention_blocks_are_indexed() -> None:
    ingest, index = make()
    await ingest.apply(
        E,
        batch(
            stored(0, 2, medium="CPU"),
            stored(0, 2, kind="sliding_window", group_idx=1),
            stored(0, 2, medium=None, kind=None, group_idx=None),  # older vLLM: no tier, no kind
        ),
    )
    assert await held(index) == 2
    assert ingest.counters.ignored_events == 2
    # A removal from another group or tier does not touch the full-attention entry.
    await ingest.apply(E, batch(stored(0, 2), BlockRemoved((EngineBlockHash(HASHES[1]),), "GPU", 1)))
    await ingest.apply(E, batch(BlockRemoved((EngineBlockHash(HASHES[1]),), "CPU", 0)))
    assert await held(index) == 2
    await ingest.apply(E, batch(BlockRemoved((EngineBlockHash(HASHES[1]),), "GPU", 0)))
    assert await held(index) == 1


class RecordingIndex(MemoryPrefixIndex):
    """A memory index that records the calls it gets and can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self.chains: list[Chain | None] = []
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise IndexUnavailable("down")

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        return await super().match(hashes, endpoints)

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
    ) -> None:
        self._check()
        self.calls.append(("store", len(hashes)))
        self.chains.append(chain)
        await super().store(endpoint, hashes, ttl_s=ttl_s)

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        self._check()
        self.calls.append(("remove", len(hashes)))
        await super().remove(endpoint, hashes)

    async def clear(self, endpoint: EndpointId) -> None:
        self._check()
        self.calls.append(("clear", 0))
        await super().clear(endpoint)


async def test_runs_of_events_are_coalesced_into_one_index_call() -> None:
    index = RecordingIndex()
    ingest = Ingest(index, lambda _e: HashScheme())
    removes = [BlockRemoved((EngineBlockHash(h),), "GPU", 0) for h in HASHES[3:6]]
    await ingest.apply(E, batch(stored(0, 3), stored(3, 3), *removes, AllBlocksCleared(), stored(0, 1)))
    assert index.calls == [("store", 6), ("remove", 3), ("clear", 0), ("store", 1)]
    # Each event's place in the coalesced call is claimed as a chain segment after its parent.
    assert index.chains == [Chain(((0, None), (3, BlockHash(HASHES[2])))), Chain(((0, None),))]


async def test_a_chain_is_claimed_only_for_whole_events() -> None:
    index = RecordingIndex()
    ingest = Ingest(index, lambda _e: None)
    placeholder = dataclasses.replace(stored(3, 1), token_ids=(), block_size=0)  # an offload tier's: no tokens
    masked = dataclasses.replace(stored(4, 2), token_ids=tuple(TOKENS[64:112]))  # a block skipped in the hashes
    await ingest.apply(E, batch(stored(0, 2), stored(2, 1)))
    await ingest.apply(E, batch(stored(0, 2), placeholder))  # one part without a chain: no claim for the call
    await ingest.apply(E, batch(masked))
    assert index.chains == [Chain(((0, None), (2, BlockHash(HASHES[1])))), None, None]


async def test_index_failure_schedules_a_purge_before_the_next_batch() -> None:
    index = RecordingIndex()
    ingest = Ingest(index, lambda _e: HashScheme())
    await ingest.apply(E, batch(stored(0, 3)))
    index.down = True
    assert await ingest.apply(E, batch(stored(3, 2))) is Outcome.WRITE_LOST  # lost write: must not raise
    assert ingest.status(E).cold
    assert await ingest.apply(E, batch(stored(5, 1))) is Outcome.WRITE_LOST  # purge retried, fails again
    assert ingest.counters.index_errors == 2
    index.down = False
    index.calls.clear()
    assert await ingest.apply(E, batch(stored(0, 2))) is Outcome.APPLIED
    assert index.calls == [("clear", 0), ("store", 2)]
    assert await held(index) == 2 and not ingest.status(E).cold


@pytest.mark.redis
async def test_ingest_writes_through_the_redis_backend(valkey_url: str) -> None:
    import uuid

    from extproc.redis.prefix_index import RedisPrefixIndex

    index = await RedisPrefixIndex.connect(valkey_url, namespace=f"i{uuid.uuid4().hex[:8]}")
    try:
        ingest = Ingest(index, lambda _e: DEFAULT_SCHEME)
        payload = decode_batch(GOLDEN_PAYLOAD)
        await ingest.apply(E, EventBatch(payload.ts, payload.events[:3], payload.dp_rank))
        assert await index.match(blocks(len(HASHES)), [E]) == {E: 4}
        await ingest.apply(E, batch(AllBlocksCleared()))
        assert await index.match(blocks(len(HASHES)), [E]) == {}
    finally:
        await index.close()


async def test_block_totals_are_counted_per_endpoint() -> None:
    """The fleet metrics' per-endpoint stores/removals (``router_endpoint_kv_blocks_*``) add up to the totals."""
    ingest, _ = make()
    other = EndpointId("10.0.0.2:8000")
    await ingest.apply(E, batch(stored(0, 3), BlockRemoved((EngineBlockHash(HASHES[2]),), "GPU", 0)))
    await ingest.apply(other, batch(stored(0, 2)))
    assert ingest.block_totals(E) == (3, 1)
    assert ingest.block_totals(other) == (2, 0)
    assert ingest.block_totals(EndpointId("10.0.0.3:8000")) == (0, 0)
    assert (ingest.counters.blocks_stored, ingest.counters.blocks_removed) == (5, 1)
