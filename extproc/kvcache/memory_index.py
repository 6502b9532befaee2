"""In-memory ``PrefixIndex``: the embedded default for one router replica.

Used two ways by the router:

* the *precise* index, fed by engines' KV events: no capacity, no TTL (engines tell us about evictions);
* the *approximate* index, fed by our own routing decisions: ``capacity_blocks`` = the endpoint's KV blocks
  (LRU eviction beyond it) and a TTL per ``store`` (e.g. 600 s).

Data shapes::

    _blocks: {block_hash: {endpoint: expires_at}}        # expires_at = math.inf when stored without ttl
    _lru:    {endpoint: OrderedDict[block_hash, None]}   # least recently stored first

Costs: ``match`` is O(matched blocks × requested endpoints); ``store``/``remove`` are O(len(hashes)) plus
amortised O(1) per eviction; ``clear`` is O(that endpoint's entries).

LRU order within one ``store`` call: the *tail* blocks count as older than the head blocks, so that capacity
eviction drops a prompt's last blocks first and keeps its prefix (vLLM frees a request's blocks tail first for
the same reason). Across calls, the least recently stored call is evicted first.

Expired entries are ignored by ``match`` immediately and reclaimed lazily: ``store`` drops expired entries
from the old end of the endpoint's LRU, and capacity eviction reclaims the rest.

All methods are synchronous under the hood (no awaits inside), so concurrent coroutines never observe a
half-applied call. Not thread-safe: use it from one event loop.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence

from extproc.types import BlockHash, EndpointId

CapacityFn = Callable[[EndpointId], int | None]
"""Per-endpoint capacity in blocks (``None`` = unbounded), e.g. the endpoint's ``num_gpu_blocks``."""


class MemoryPrefixIndex:
    """A ``PrefixIndex`` held in this process's memory.

    ``capacity_blocks``: ``None`` (unbounded), one bound for every endpoint, or a function giving each
    endpoint's bound (called on every ``store``; returning ``None`` means unbounded). ``clock`` returns
    seconds on a monotonic scale and is injectable for tests.
    """

    def __init__(
        self,
        *,
        capacity_blocks: int | CapacityFn | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(capacity_blocks, int) and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self._capacity = capacity_blocks
        self._clock = clock
        self._blocks: dict[BlockHash, dict[EndpointId, float]] = {}
        self._lru: dict[EndpointId, OrderedDict[BlockHash, None]] = {}
        self._ttl_seen = False  # once any entry had a ttl, match checks expiry (the precise index never does)

    # -- PrefixIndex -------------------------------------------------------------------------------

    async def match(
        self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]
    ) -> Mapping[EndpointId, int]:
        """Leading-run length per endpoint (endpoints with 0 are omitted). Never raises."""
        return self.match_sync(hashes, endpoints)

    async def store(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None
    ) -> None:
        """Record ``hashes`` on ``endpoint``, refreshing LRU position and expiry; evicts beyond capacity."""
        self.store_sync(endpoint, hashes, ttl_s=ttl_s)

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Forget ``hashes`` on ``endpoint``; unknown ones are ignored."""
        self.remove_sync(endpoint, hashes)

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint`` in O(its entries)."""
        self.clear_sync(endpoint)

    async def close(self) -> None:
        """Drop all entries."""
        self._blocks.clear()
        self._lru.clear()

    # -- synchronous core --------------------------------------------------------------------------

    def match_sync(
        self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]
    ) -> dict[EndpointId, int]:
        """Synchronous ``match``: walk from block 0, keeping the endpoints that hold every block so far."""
        alive = {e for e in endpoints if e in self._lru}
        depth = 0  # blocks matched by every endpoint still in ``alive``
        result: dict[EndpointId, int] = {}
        now = self._clock() if self._ttl_seen else math.inf
        for h in hashes:
            if not alive:
                break
            holders = self._blocks.get(h)
            if holders is None:
                break
            still = alive & holders.keys()  # C-speed; iterates the smaller side
            if self._ttl_seen:
                still = {e for e in still if holders[e] > now}
            if depth:
                for gone in alive - still:
                    result[gone] = depth
            alive = still
            depth += 1
        if depth:
            for e in alive:
                result[e] = depth
        return result

    def store_sync(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None
    ) -> None:
        """Synchronous ``store``."""
        if not hashes:
            return
        now = self._clock()
        expires = math.inf if ttl_s is None else now + ttl_s
        if ttl_s is not None:
            self._ttl_seen = True
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
        # Reverse: the head block ends up most recently used, so the tail is evicted first.
        for h in reversed(hashes):
            holders = self._blocks.get(h)
            if holders is None:
                holders = self._blocks[h] = {}
            holders[endpoint] = expires
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        self._reclaim(endpoint, lru, now)

    def remove_sync(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Synchronous ``remove``."""
        lru = self._lru.get(endpoint)
        if lru is None:
            return
        for h in hashes:
            if lru.pop(h, 0) is None:  # present (values are None)
                self._drop_holder(h, endpoint)
        if not lru:
            del self._lru[endpoint]

    def clear_sync(self, endpoint: EndpointId) -> None:
        """Synchronous ``clear``."""
        lru = self._lru.pop(endpoint, None)
        if lru is None:
            return
        for h in lru:
            self._drop_holder(h, endpoint)

    def entries(self, endpoint: EndpointId) -> int:
        """How many blocks ``endpoint`` has in the index (expired but not yet reclaimed ones included)."""
        lru = self._lru.get(endpoint)
        return 0 if lru is None else len(lru)

    def endpoints(self) -> frozenset[EndpointId]:
        """Endpoints with at least one entry."""
        return frozenset(self._lru)

    # -- internals ---------------------------------------------------------------------------------

    def _capacity_for(self, endpoint: EndpointId) -> int | None:
        cap = self._capacity
        if cap is None or isinstance(cap, int):
            return cap
        return cap(endpoint)

    def _reclaim(self, endpoint: EndpointId, lru: OrderedDict[BlockHash, None], now: float) -> None:
        """Evict beyond capacity, then drop expired entries at the old end of the LRU (amortised O(1))."""
        cap = self._capacity_for(endpoint)
        if cap is not None:
            while len(lru) > cap:
                h, _ = lru.popitem(last=False)
                self._drop_holder(h, endpoint)
        while lru:
            h = next(iter(lru))
            if self._blocks[h][endpoint] > now:
                break
            lru.popitem(last=False)
            self._drop_holder(h, endpoint)
        if not lru:
            del self._lru[endpoint]

    def _drop_holder(self, h: BlockHash, endpoint: EndpointId) -> None:
        holders = self._blocks.get(h)
        if holders is None:
            return
        holders.pop(endpoint, None)
        if not holders:
            del self._blocks[h]
