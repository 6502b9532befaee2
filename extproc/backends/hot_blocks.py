"""Per endpoint, the blocks its recent cache hits came from: the part of its prefix cache a copy must not evict.

A prefix cache that has served a while is full (vLLM keeps every freed block until it needs the space), but most
of it is dead weight: each request's own question and answer, used once. What a spill must not push out is the
*hot* part, the blocks that requests are hitting. A block stays hot while fewer than ``capacity`` blocks have
been stored on the endpoint since its last hit: vLLM evicts least recently used first, so that is exactly how
long an unreused block survives. No window to tune: the endpoint's own capacity and store rate set it.

Fed by the decider once per decision (``routed``), read per candidate (``hot``, ``hits``: how often the
request's deepest cached block was hit there, the reuse a copy of that prefix is spread over). Kept to what the
engine still holds by its KV events (a ``CacheObserver`` of ``kvcache.gate.ObservedWrites``): an evicted block
is not hot, and a cleared cache (``AllBlocksCleared``, a purge) or an endpoint that left has no hot blocks.
Without that, the hot sets of a cache that was reset outlived it, read as full on every endpoint, and cold
placement fell back to the momentary estimate: the spill cascade's last cause (``docs/scheduling.md``). Not
thread-safe: the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from extproc.types import BlockHash, EndpointId


@dataclass(slots=True)
class _Endpoint:
    stored: int = 0  # blocks stored on the endpoint so far (our routed uncached blocks)
    # {block_hash: value of ``stored`` at its last hit}, oldest hit first
    hits: OrderedDict[BlockHash, int] = field(default_factory=OrderedDict)
    counts: dict[BlockHash, int] = field(default_factory=dict)  # {block_hash: requests that hit it while hot}


class HotBlocks:
    """Blocks hit on each endpoint that its LRU has not cycled past yet (``capacity`` gives the endpoint's
    KV blocks; ``None``: unknown, nothing is tracked and ``hot`` is ``None``)."""

    def __init__(self, capacity: Callable[[EndpointId], int | None]) -> None:
        self._capacity = capacity
        self._eps: dict[EndpointId, _Endpoint] = {}

    def routed(self, endpoint: EndpointId, hashes: Sequence[BlockHash], cached_blocks: int, *, placed: bool) -> None:
        """A request went to ``endpoint``: its first ``cached_blocks`` blocks were hits, the rest are stored.
        ``placed``: a cold prompt placed there (a new prefix, reason ``load``): all its blocks count as hot at
        once, so that a burst of new prefixes is spread before their second requests arrive."""
        cap = self._capacity(endpoint)
        if cap is None:
            return
        ep = self._eps.setdefault(endpoint, _Endpoint())
        ep.stored += max(len(hashes) - cached_blocks, 0)
        hot = hashes if placed else hashes[:cached_blocks]
        for i in range(len(hot) - 1, -1, -1):  # the root block last: it is the most recently useful
            h = hot[i]
            ep.hits[h] = ep.stored
            ep.hits.move_to_end(h)
            ep.counts[h] = ep.counts.get(h, 0) + (i < cached_blocks)
        self._prune(ep, cap)

    def hot(self, endpoint: EndpointId) -> int | None:
        """Blocks of ``endpoint``'s cache that recent requests hit; ``None`` when its capacity is unknown."""
        cap = self._capacity(endpoint)
        if cap is None:
            return None
        ep = self._eps.get(endpoint)
        if ep is None:
            return 0
        self._prune(ep, cap)
        return len(ep.hits)

    def hits(self, endpoint: EndpointId, block: BlockHash) -> int:
        """Requests routed to ``endpoint`` that hit ``block`` while it stayed hot: how often that prefix is reused
        there (0: never hit, or no longer hot)."""
        ep = self._eps.get(endpoint)
        return ep.counts.get(block, 0) if ep is not None else 0

    def removed(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """The engine evicted ``hashes`` (``BlockRemoved``): they are no longer cached there, so not hot."""
        ep = self._eps.get(endpoint)
        if ep is None:
            return
        for h in hashes:
            if ep.hits.pop(h, None) is not None:
                ep.counts.pop(h, None)

    def stored(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """The engine stored ``hashes`` (``BlockStored``): nothing to do, a block becomes hot by a hit, and what
        was stored is counted from our own routing (``routed``)."""

    def cleared(self, endpoint: EndpointId) -> None:
        """The endpoint left, or its cache was cleared (``AllBlocksCleared``, a purge)."""
        self._eps.pop(endpoint, None)

    @staticmethod
    def _prune(ep: _Endpoint, cap: int) -> None:
        hits = ep.hits
        while hits:
            oldest, at = next(iter(hits.items()))
            if ep.stored - at < cap and len(hits) <= cap:
                return
            del hits[oldest]
            ep.counts.pop(oldest, None)
