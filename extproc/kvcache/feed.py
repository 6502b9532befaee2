"""The precise index's write path, assembled: KV-event sources from config → subscriber → ingest → index.

``EventFeed`` owns the subscriber. Each endpoint whose config names a ``kv_events`` publisher is followed; the
router asks ``is_precise(endpoint)`` per request to choose between the precise index and our own guesses.

A purge (engine restart, unreplayable gap, reconnect, ``AllBlocksCleared``) also clears the endpoint's
*approximate* entries: a restarted engine holds nothing, and neither our guesses nor our burst marks may
outlive that.

With ``leases`` (replicas sharing a Redis index) only the lease holder writes an endpoint's events to the
shared index (``lease.py``); every replica still follows every stream, and purges still clear its own
approximate entries.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from extproc.config import EndpointConfig
from extproc.kvcache.index import Chain, PrefixIndex
from extproc.kvcache.ingest import Ingest
from extproc.kvcache.lease import StreamLeases
from extproc.kvcache.subscriber import EventSource, KvEventSubscriber, SubscriberOptions
from extproc.types import BlockHash, EndpointId, HashScheme


class _ClearsBoth:
    """The precise index as ingest sees it: writes go to ``precise``; ``clear`` empties ``approx`` too.

    Except when the purge only repeats one the index could not take (``index_retry``): then the engine's cache
    did not change, and the guesses we made while the index was down are still our best knowledge. ``approx``
    is cleared first, so a purge for a real engine event clears our guesses even when the precise index is down.
    """

    def __init__(self, precise: PrefixIndex, approx: PrefixIndex, index_retry: Callable[[EndpointId], bool]) -> None:
        self._precise = precise
        self._approx = approx
        self._index_retry = index_retry

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        return await self._precise.match(hashes, endpoints)

    async def store(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *,
        ttl_s: float | None = None, chain: Chain | None = None
    ) -> None:
        await self._precise.store(endpoint, hashes, ttl_s=ttl_s, chain=chain)

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        await self._precise.remove(endpoint, hashes)

    async def clear(self, endpoint: EndpointId) -> None:
        if not self._index_retry(endpoint):
            await self._approx.clear(endpoint)
        await self._precise.clear(endpoint)

    async def close(self) -> None:  # the App closes both indexes itself
        return None


def sources_from_config(endpoints: Iterable[EndpointConfig]) -> list[EventSource]:
    """One ``EventSource`` per endpoint whose config names a KV-event publisher."""
    return [
        EventSource(
            endpoint=EndpointId(e.address),
            address=e.kv_events.endpoint,
            replay_address=e.kv_events.replay_endpoint,
            topic=e.kv_events.topic,
        )
        for e in endpoints
        if e.kv_events is not None
    ]


class EventFeed:
    """Follows every configured KV-event source; ``is_precise`` is the router's per-request switch."""

    def __init__(
        self,
        sources: Sequence[EventSource],
        precise: PrefixIndex,
        approx: PrefixIndex,
        scheme_for: Callable[[EndpointId], HashScheme | None],
        options: SubscriberOptions | None = None,
        leases: StreamLeases | None = None,
    ) -> None:
        self._sources = list(sources)
        self.leases = leases
        writes = precise if leases is None else leases.writes()
        self.ingest = Ingest(_ClearsBoth(writes, approx, lambda e: self.ingest.state(e).needs_purge), scheme_for)
        self.subscriber = KvEventSubscriber(self.ingest, options=options, gate=leases)

    def start(self) -> None:
        """Begin following every source (one background task each, owned by the subscriber)."""
        if self.leases is not None:
            self.leases.start()
        for source in self._sources:
            self.subscriber.add(source)

    def is_precise(self, endpoint: EndpointId) -> bool:
        return self.subscriber.is_precise(endpoint)

    def has_live_events(self, endpoint: EndpointId) -> bool:
        return self.subscriber.has_live_events(endpoint)

    async def stop(self) -> None:
        """Stop following (no more writes), then release the leases so other replicas take over at once."""
        await self.subscriber.close()
        if self.leases is not None:
            await self.leases.close()
