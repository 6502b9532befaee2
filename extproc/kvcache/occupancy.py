"""Which tenant class put which blocks on which endpoint: attribution from our routing, confirmed by events.

Two writers, one owner (the composition root), both on the event loop:

* the decider, per routed request (``routed``): the blocks the prompt will *add* on the pick (those past its
  cached prefix) become *pending* for the request's class there, and the class's uncached tokens join a
  per-(endpoint, class) queue that drains at the prefill rate (``inflight_uncached``);
* the ingest, through ``gate.ObservedWrites`` (a tee in front of the precise index's writes): a ``BlockStored``
  hash that is pending on that endpoint becomes *owned* by the pending class (otherwise it is owned by
  ``UNATTRIBUTED``: another replica routed it, or the pending entry expired); a ``BlockRemoved`` frees it and
  counts one eviction suffered by its owner and one caused by the class that last routed uncached tokens
  there (vLLM evicts to make room for the prefill in progress; which request's prefill that is, the events do
  not say, so this is the likeliest one, not a certainty); ``AllBlocksCleared`` and purges forget the endpoint.

Shapes: ``_owned = {endpoint: {block_hash: class}}``; ``_counts = {endpoint: {class: blocks}}``;
``_pending = {endpoint: OrderedDict{block_hash: (class, routed_at_s)}}``, oldest first, bounded by
``pending_ttl_s`` and ``_PENDING_MAX`` per endpoint; ``_pending_counts = {endpoint: {class: pending blocks}}``
(kept beside it, so a view costs a few classes, not a walk of the pending blocks). cache_salt is untouched:
the hashes are vLLM's own, salt included, so two classes sharing a salt-free prefix share its blocks (the first
to store one owns it).

``view(endpoint)`` is the frozen ``EndpointShares`` a ``Candidate`` carries into the pure decision.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from extproc.types import BlockHash, EndpointId, EndpointShares

UNATTRIBUTED = "unattributed"  # the owner of blocks no request of ours is known to have put there
_PENDING_MAX = 65536  # pending blocks per endpoint (the oldest are forgotten first)


@dataclass
class ClassCounters:
    """Totals since start for one (class, endpoint); exported by ``status.tenant_cache``."""

    evictions_caused: int = 0  # blocks removed while this class's prefill was the latest there
    blocks_evicted: int = 0  # this class's own blocks removed
    protected_hits: int = 0  # requests of a protected class that hit blocks their class owns there
    hit_blocks: int = 0  # leading blocks served from cache to this class's requests (our estimate)


class Occupancy:
    """The per-endpoint, per-class cache bookkeeping. Not thread-safe: call it from the event loop."""

    def __init__(
        self,
        prefill_tokens_per_s: float,
        protected: Callable[[str], bool],
        *,
        pending_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``protected(class)``: whether that class's hits count as protected hits."""
        self._rate = prefill_tokens_per_s
        self._protected = protected
        self._ttl_s = pending_ttl_s
        self._clock = clock
        self._owned: dict[EndpointId, dict[BlockHash, str]] = {}
        self._counts: dict[EndpointId, dict[str, int]] = {}
        self._pending: dict[EndpointId, OrderedDict[BlockHash, tuple[str, float]]] = {}
        self._pending_counts: dict[EndpointId, dict[str, int]] = {}
        self._queues: dict[EndpointId, dict[str, tuple[float, float]]] = {}  # {class: (tokens, updated_at_s)}
        self._last_writer: dict[EndpointId, str] = {}
        self._counters: dict[tuple[str, EndpointId], ClassCounters] = {}

    # -- the read path ---------------------------------------------------------------------------------------
    def view(self, endpoint: EndpointId) -> EndpointShares:
        """A frozen copy of ``endpoint``'s cache by class (a few classes: cheap), for one ``Candidate``."""
        owned = self._owned.get(endpoint)
        now = self._clock()
        queues = self._queues.get(endpoint, {})
        return EndpointShares(
            used_blocks=len(owned) if owned else 0,
            by_class=dict(self._counts.get(endpoint, {})),
            inflight_uncached={cls: self._drained(t, at, now) for cls, (t, at) in queues.items()},
            pending_by_class=dict(self._pending_counts.get(endpoint, {})),
        )

    def routed(self, endpoint: EndpointId, cls: str, hashes: Sequence[BlockHash], cached_blocks: int,
               uncached_tokens: int) -> None:  # fmt: skip
        """Called once per routed request, right after the decision (``LocalDecider._record``)."""
        now = self._clock()
        owned = self._owned.get(endpoint, {})
        c = self._counter(cls, endpoint)
        c.hit_blocks += cached_blocks
        if cached_blocks and self._protected(cls) and any(owned.get(h) == cls for h in hashes[:cached_blocks]):
            c.protected_hits += 1
        if uncached_tokens > 0:
            queues = self._queues.setdefault(endpoint, {})
            tokens, at = queues.get(cls, (0.0, now))
            queues[cls] = (self._drained(tokens, at, now) + uncached_tokens, now)
            self._last_writer[endpoint] = cls
        pending = self._pending.setdefault(endpoint, OrderedDict())
        counts = self._pending_counts.setdefault(endpoint, {})
        for h in hashes[cached_blocks:]:
            if h not in owned:
                before = pending.get(h)
                if before is not None:
                    _uncount(counts, before[0])
                pending[h] = (cls, now)
                pending.move_to_end(h)
                counts[cls] = counts.get(cls, 0) + 1
        self._expire(pending, counts, now)

    def counters(self) -> Iterator[tuple[str, EndpointId, ClassCounters]]:
        for (cls, endpoint), c in self._counters.items():
            yield cls, endpoint, c

    def occupancy(self) -> Iterator[tuple[str, EndpointId, int]]:
        """``(class, endpoint, blocks)`` for every class holding blocks somewhere."""
        for endpoint, counts in self._counts.items():
            for cls, n in counts.items():
                yield cls, endpoint, n

    # -- the write path (ObservedWrites) ----------------------------------------------------------------------
    def stored(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        owned = self._owned.setdefault(endpoint, {})
        counts = self._counts.setdefault(endpoint, {})
        pending = self._pending.get(endpoint)
        pending_counts = self._pending_counts.get(endpoint, {})
        for h in hashes:
            if h in owned:
                continue
            entry = pending.pop(h, None) if pending is not None else None
            if entry is not None:
                _uncount(pending_counts, entry[0])
            cls = entry[0] if entry is not None else UNATTRIBUTED
            owned[h] = cls
            counts[cls] = counts.get(cls, 0) + 1

    def removed(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        owned = self._owned.get(endpoint)
        if not owned:
            return
        counts = self._counts[endpoint]
        writer = self._last_writer.get(endpoint, UNATTRIBUTED)
        for h in hashes:
            cls = owned.pop(h, None)
            if cls is None:
                continue
            counts[cls] -= 1
            if not counts[cls]:
                del counts[cls]
            self._counter(cls, endpoint).blocks_evicted += 1
            self._counter(writer, endpoint).evictions_caused += 1

    def cleared(self, endpoint: EndpointId) -> None:
        """The engine holds nothing now (``AllBlocksCleared``, a purge) or the endpoint left (``lifecycle``)."""
        self._owned.pop(endpoint, None)
        self._counts.pop(endpoint, None)
        self._pending.pop(endpoint, None)
        self._pending_counts.pop(endpoint, None)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _drained(self, tokens: float, at_s: float, now_s: float) -> float:
        return max(0.0, tokens - self._rate * (now_s - at_s))

    def _expire(self, pending: OrderedDict[BlockHash, tuple[str, float]], counts: dict[str, int],
                now_s: float) -> None:  # fmt: skip
        while pending:
            _h, (_cls, at) = next(iter(pending.items()))
            if now_s - at <= self._ttl_s and len(pending) <= _PENDING_MAX:
                return
            pending.popitem(last=False)
            _uncount(counts, _cls)

    def _counter(self, cls: str, endpoint: EndpointId) -> ClassCounters:
        c = self._counters.get((cls, endpoint))
        if c is None:
            c = self._counters[(cls, endpoint)] = ClassCounters()
        return c


def _uncount(counts: dict[str, int], cls: str) -> None:
    counts[cls] -= 1
    if not counts[cls]:
        del counts[cls]
