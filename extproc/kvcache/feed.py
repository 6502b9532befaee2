"""The precise index's write path, assembled: KV-event sources → subscriber → ingest → index.

``EventFeed`` owns the subscriber and the ingest. The composition root tells it which endpoints to
``follow``/``unfollow``; the router takes ``precise_endpoints()`` once per request to choose, per endpoint,
between the precise index and our own guesses.

Ingest clears the endpoint's *approximate* entries on a real purge (``ingest.py``). With ``leases`` (replicas
sharing a Redis index) ``writes`` is the leases' fenced view of the shared index: only the lease holder writes
an endpoint's events there (``extproc/redis/leases.py``); every replica still follows every stream, and purges
still clear its own approximate entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from extproc.kvcache.gate import IndexWrites, WriteGate
from extproc.kvcache.index import GuessIndex
from extproc.kvcache.ingest import Ingest
from extproc.kvcache.subscriber import EventSource, KvEventSubscriber, StreamStatus, SubscriberOptions
from extproc.types import EndpointId, HashScheme


class Leases(WriteGate, Protocol):
    """A ``WriteGate`` with its own keeper task (``StreamLeases``)."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


class EventFeed:
    """Follows KV-event sources; ``precise_endpoints`` is the router's per-request snapshot."""

    def __init__(
        self,
        sources: Sequence[EventSource],
        writes: IndexWrites,
        approx: GuessIndex,
        scheme_for: Callable[[EndpointId], HashScheme | None],
        options: SubscriberOptions | None = None,
        leases: Leases | None = None,
    ) -> None:
        """``sources``: followed from ``start``; ``writes``: the precise index (with ``leases``: their fenced
        view of it, ``StreamLeases.writes``)."""
        self._sources = list(sources)
        self.leases = leases
        self.ingest = Ingest(writes, scheme_for, approx=approx)
        self.subscriber = KvEventSubscriber(self.ingest, options=options, gate=leases)

    def start(self) -> None:
        """Begin following every source (one background task each, owned by the subscriber)."""
        if self.leases is not None:
            self.leases.start()
        for source in self._sources:
            self.follow(source)

    def follow(self, source: EventSource) -> None:
        """Start following ``source`` (a no-op if its endpoint is followed already)."""
        if not self.subscriber.follows(source.endpoint):
            self.subscriber.add(source)

    def follows(self, endpoint: EndpointId) -> bool:
        return self.subscriber.follows(endpoint)

    async def unfollow(self, endpoint: EndpointId) -> None:
        """Stop following ``endpoint`` (it left the pool). Its index entries are the caller's to clear."""
        await self.subscriber.remove(endpoint, clear=False)

    def is_precise(self, endpoint: EndpointId) -> bool:
        return self.subscriber.is_precise(endpoint)

    def precise_endpoints(self) -> frozenset[EndpointId]:
        """The endpoints whose precise-index entries are the truth now (``KvEventSubscriber.is_precise``)."""
        return self.subscriber.precise_endpoints()

    def has_live_events(self, endpoint: EndpointId) -> bool:
        return self.subscriber.has_live_events(endpoint)

    def status(self, endpoint: EndpointId) -> StreamStatus | None:
        """``endpoint``'s stream status (None: not followed), for the status page and fleet metrics."""
        return self.subscriber.status(endpoint)

    def block_totals(self, endpoint: EndpointId) -> tuple[int, int]:
        """``(blocks stored, blocks removed)`` its events applied (``Ingest.block_totals``)."""
        return self.ingest.block_totals(endpoint)

    def counters(self) -> list[tuple[str, object]]:
        """The write path's counter groups (exported as ``router_kv_<group>_<field>``)."""
        return [("ingest", self.ingest.counters), ("stream", self.subscriber.counters)]

    async def stop(self) -> None:
        """Stop following (no more writes), then release the leases so other replicas take over at once."""
        await self.subscriber.close()
        if self.leases is not None:
            await self.leases.close()
