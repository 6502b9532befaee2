"""``EndpointLifecycle``: one place for endpoint come and go; a gone endpoint is forgotten everywhere, once."""

from __future__ import annotations

from collections.abc import Mapping

from extproc.backends.inflight import InflightLoad
from extproc.backends.registry import EndpointRegistry
from extproc.indexes import Indexes
from extproc.kvcache.feed import EventFeed
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.subscriber import EventSource
from extproc.lifecycle import EndpointLifecycle
from extproc.types import BlockHash, Endpoint, EndpointId

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
H = [BlockHash(1), BlockHash(2)]


class CountingIndex(MemoryPrefixIndex):
    def __init__(self) -> None:
        super().__init__()
        self.clears: list[EndpointId] = []

    async def clear(self, endpoint: EndpointId) -> None:
        self.clears.append(endpoint)
        await super().clear(endpoint)


async def test_a_gone_endpoint_is_unfollowed_cleared_once_and_its_load_forgotten() -> None:
    precise, approx = CountingIndex(), CountingIndex()
    registry = EndpointRegistry([Endpoint(A)])
    inflight = InflightLoad(1000.0)
    feed = EventFeed([], precise, approx, lambda _e: None)
    targets: list[Mapping[EndpointId, str]] = []
    forgotten: list[EndpointId] = []
    life = EndpointLifecycle(registry, targets.append, feed, Indexes(precise, approx, writes=precise), inflight,
                             [forgotten.append])  # fmt: skip
    events = {B: EventSource(B, "ipc:///tmp/nobody-lifecycle-b")}

    life.discovered({A: frozenset()}, frozenset({B, C}), events.get)
    assert set(registry.snapshot()) == {A, B, C} and set(targets[-1]) == {A, B, C}
    assert feed.follows(B) and not feed.follows(C)  # only where discovery names KV events
    for e in (B, C):
        await precise.store(e, H)
        await approx.store(e, H)
        inflight.add(e, 500)

    life.discovered({A: frozenset()}, frozenset(), events.get)  # B and C are gone
    await life.stop()  # drains the cleanups
    assert set(registry.snapshot()) == {A}
    assert not feed.follows(B)
    assert sorted(precise.clears) == [B, C] and sorted(approx.clears) == [B, C]  # once each, not twice
    assert inflight.routed_since_scrape(B) == 0 and inflight.routed_since_scrape(C) == 0  # dropped, not drained
    assert sorted(forgotten) == [B, C]  # the tenant cache bookkeeping (app.py passes Occupancy.cleared)
    await feed.stop()


async def test_an_endpoint_that_refuses_connections_loses_our_guesses() -> None:
    precise, approx = CountingIndex(), CountingIndex()
    feed = EventFeed([], precise, approx, lambda _e: None)
    life = EndpointLifecycle(
        EndpointRegistry([Endpoint(A)]),
        lambda _t: None,
        feed,
        Indexes(precise, approx, writes=precise),
        InflightLoad(1000.0),
    )
    await approx.store(A, H)
    life.down(A)
    await life.stop()
    assert approx.clears == [A] and precise.clears == [] and await approx.match(H, [A]) == {}
    await feed.stop()
