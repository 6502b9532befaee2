"""Endpoint come and go: the one place that knows whom to tell (registry, scraper, event feed, both indexes,
in-flight and shared load).

When: ``discovered`` after each DNS discovery round that changed the set; ``down`` when an endpoint refuses
connections (the scraper's ``on_down``). The cleanups run as background tasks this object owns; ``stop``
drains them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from extproc.backends.inflight import InflightLoad
from extproc.backends.registry import EndpointRegistry
from extproc.indexes import Indexes
from extproc.kvcache.feed import EventFeed
from extproc.kvcache.subscriber import EventSource
from extproc.tasks import stop_task
from extproc.types import Endpoint, EndpointId, Role

log = logging.getLogger(__name__)

_DRAIN_S = 2.0  # how long ``stop`` waits for cleanups before cancelling them


class EndpointLifecycle:
    """Tells everyone about endpoints that come and go. ``events_for(eid)``: a discovered endpoint's KV-event
    source, or None (static endpoints' sources are followed from the start by the feed)."""

    def __init__(
        self,
        registry: EndpointRegistry,
        set_targets: Callable[[Mapping[EndpointId, str]], None],
        feed: EventFeed,
        indexes: Indexes,
        inflight: InflightLoad,
        forgets: Sequence[Callable[[EndpointId], None]] = (),
    ) -> None:
        """``forgets``: more per-endpoint state to drop when an endpoint leaves (the tenant cache bookkeeping)."""
        self._registry = registry
        self._forgets = tuple(forgets)
        self._set_targets = set_targets
        self._feed = feed
        self._indexes = indexes
        self._inflight = inflight
        self._tasks: set[asyncio.Task[None]] = set()

    def discovered(
        self,
        static: Mapping[EndpointId, frozenset[str]],
        found: frozenset[EndpointId],
        events_for: Callable[[EndpointId], EventSource | None],
        *,
        roles: Mapping[EndpointId, Role] | None = None,
    ) -> None:
        """The set is now ``static`` plus ``found``: new ones are scraped and their events followed; gone ones
        are forgotten everywhere (``gone``). ``roles``: the P/D role of discovered ones (default both; static
        endpoints keep the one they were registered with)."""
        roles = roles or {}
        ids = [*static, *sorted(found - static.keys())]
        gone = set(self._registry.snapshot()) - set(ids)
        self._registry.sync(
            Endpoint(eid, models=static.get(eid, frozenset()), role=roles.get(eid, Role.BOTH)) for eid in ids
        )
        self._set_targets({eid: f"http://{eid}" for eid in ids})
        for eid in ids:
            source = None if eid in static else events_for(eid)
            if source is not None:
                self._feed.follow(source)
        for eid in gone:
            self._spawn(self.gone(eid))

    def down(self, eid: EndpointId) -> None:
        """``eid`` refuses connections (its engine died or is restarting): an engine that comes back holds an
        empty cache, so our guesses about it go now. (Event-fed endpoints are purged by their stream too.)"""
        self._spawn(self._quietly("clearing the approximate entries of", eid, self._indexes.approx.clear(eid)))

    async def gone(self, eid: EndpointId) -> None:
        """``eid`` left the pool: stop following its events, clear both indexes once, drop its load. Best
        effort: a gone endpoint is never a candidate anyway."""
        if self._feed.follows(eid):
            await self._quietly("unfollowing the KV events of", eid, self._feed.unfollow(eid))
        await self._quietly("clearing the approximate entries of", eid, self._indexes.approx.clear(eid))
        await self._quietly("clearing the precise entries of", eid, self._indexes.precise.clear(eid))
        self._inflight.forget(eid)
        for forget in self._forgets:
            forget(eid)
        if self._indexes.shared_load is not None:
            await self._quietly("forgetting the shared load of", eid, self._indexes.shared_load.forget(eid))

    async def stop(self) -> None:
        """Let running cleanups finish (bounded), then cancel what is left."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=_DRAIN_S)
        for task in tasks:
            await stop_task(task)

    def _spawn(self, coro: Awaitable[None]) -> None:
        async def run() -> None:
            await coro

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _quietly(what: str, eid: EndpointId, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception as exc:
            log.warning("%s %s failed: %s", what, eid, exc)
