"""In-memory ``PrefixIndex``: the embedded default for one router replica.

Used two ways by the router:

* the *precise* index, fed by engines' KV events: no capacity, no TTL (engines tell us about evictions);
* the *approximate* index, fed by our own routing decisions: ``capacity_blocks`` = the endpoint's KV blocks
  (LRU eviction beyond it) and a TTL per ``store`` (e.g. 600 s).

Data shapes::

    _masks: {block_hash: holders}                  # bit b set <=> the endpoint holding bit b has this block
    _eps:   {endpoint: _Endpoint(bit, lru, ...)}   # lru: OrderedDict[block_hash, expires_at], oldest first;
                                                   # expires_at = math.inf when stored without ttl

``match`` ANDs the requested endpoints' bits with each block's holders, running at C speed
(``accumulate`` over ``map``), and stops at the first block nobody requested still holds; each endpoint's
run length is then a binary search over the non-increasing running masks. Cost: O(matched blocks) big-int
ANDs + O(endpoints × log blocks), i.e. within the O(matched blocks × endpoints) budget with a tiny constant.

Expiry without slowing ``match`` down: expired entries are dropped *before* the walk, so the bits are exact.
Entries stored with an expiry no earlier than any before on that endpoint (the normal case: one TTL for the
approximate index, or none) keep its LRU in expiry order, so dropping expired entries from the LRU's old
end finds them all; entries stored with an earlier expiry than that ("late", e.g. short burst marks after
long entries) also go on a per-endpoint min-heap by expiry. ``match`` and ``store`` drain both for the
endpoints they touch: amortised O(1) per expired entry (O(log n) for late ones), none per block walked.

LRU order within one ``store`` call: the *tail* blocks count as older than the head blocks, so that capacity
eviction drops a prompt's last blocks first and keeps its prefix (vLLM frees a request's blocks tail first for
the same reason). Across calls, the least recently stored call is evicted first.

All methods are synchronous under the hood (no awaits inside), so concurrent coroutines never observe a
half-applied call. Not thread-safe: use it from one event loop.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from itertools import accumulate, repeat, takewhile
from operator import and_

from extproc.kvcache.index import Chain
from extproc.types import BlockHash, EndpointId

CapacityFn = Callable[[EndpointId], int | None]
"""Per-endpoint capacity in blocks (``None`` = unbounded), e.g. the endpoint's ``num_gpu_blocks``."""


def capacity_of(capacity: int | CapacityFn | None, endpoint: EndpointId) -> int | None:
    """``endpoint``'s bound in blocks under a ``capacity_blocks`` setting (``None``: unbounded)."""
    if capacity is None or isinstance(capacity, int):
        return capacity
    return capacity(endpoint)


_ABSENT = -1.0  # sentinel for OrderedDict.pop (real values are expiries)


class _Endpoint:
    """One endpoint's entries: its bit in the holder masks and its LRU of ``{block_hash: expires_at}``."""

    __slots__ = ("bit", "late", "lru", "max_expires")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.lru: OrderedDict[BlockHash, float] = OrderedDict()
        self.max_expires = -math.inf  # the latest expiry ever stored: later stores below it are "late"
        self.late: list[tuple[float, BlockHash]] = []  # heap of late entries (stale records are skipped)


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
        self._masks: dict[BlockHash, int] = {}
        self._eps: dict[EndpointId, _Endpoint] = {}
        self._by_bit: list[EndpointId | None] = []  # bit -> endpoint
        self._free_bits: list[int] = []
        self._ttl_seen = False  # until an entry has a ttl, match never reads the clock

    # -- PrefixIndex -------------------------------------------------------------------------------------------

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        """Leading-run length per endpoint (endpoints with 0 are omitted). Never raises."""
        return self.match_sync(hashes, endpoints)

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
    ) -> None:
        """Record ``hashes`` on ``endpoint``, refreshing LRU position and expiry; evicts beyond capacity.
        ``chain`` is not needed here: every lookup here is cheap enough to look at each block."""
        self.store_sync(endpoint, hashes, ttl_s=ttl_s)

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Forget ``hashes`` on ``endpoint``; unknown ones are ignored."""
        self.remove_sync(endpoint, hashes)

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint`` in O(its entries)."""
        self.clear_sync(endpoint)

    async def close(self) -> None:
        """Drop all entries."""
        self._masks.clear()
        self._eps.clear()
        self._by_bit.clear()
        self._free_bits.clear()

    # -- synchronous core --------------------------------------------------------------------------------------

    def match_sync(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> dict[EndpointId, int]:
        """Synchronous ``match``."""
        now = self._clock() if self._ttl_seen else math.inf
        want = 0
        for e in set(endpoints):
            ep = self._eps.get(e)
            if ep is not None and self._ttl_seen:
                self._drop_expired(e, ep, now)
                ep = self._eps.get(e)  # it may have emptied
            if ep is not None:
                want |= 1 << ep.bit
        if not want or not hashes:
            return {}
        masks: Iterable[int] = map(self._masks.get, hashes, repeat(0))
        # runs[k] = the requested endpoints holding every one of blocks 0..k-1 (runs[0] = all requested).
        runs = list(takewhile(bool, accumulate(masks, and_, initial=want)))
        result: dict[EndpointId, int] = {}
        bits = runs[1] if len(runs) > 1 else 0  # endpoints holding block 0 at least (the rest are omitted)
        while bits:
            low = bits & -bits
            bit = low.bit_length() - 1
            bits ^= low
            endpoint = self._by_bit[bit]
            if endpoint is not None:
                result[endpoint] = _held_prefix(runs, low) - 1
        return result

    def store_sync(self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None) -> None:
        """Synchronous ``store``."""
        if not hashes:
            return
        now = self._clock()
        expires = math.inf if ttl_s is None else now + ttl_s
        if ttl_s is not None:
            self._ttl_seen = True
        ep = self._eps.get(endpoint) or self._add_endpoint(endpoint)
        late = expires < ep.max_expires
        if not late:
            ep.max_expires = expires
        lru, masks, bit = ep.lru, self._masks, 1 << ep.bit
        # Reversed: the head block ends up most recently used, so the tail is evicted first.
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                masks[h] = masks.get(h, 0) | bit
            lru[h] = expires
            if late:
                heapq.heappush(ep.late, (expires, h))
        cap = capacity_of(self._capacity, endpoint)
        if cap is not None:
            while len(lru) > cap:
                self._unset(lru.popitem(last=False)[0], bit)
        self._drop_expired(endpoint, ep, now)

    def remove_sync(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Synchronous ``remove``."""
        ep = self._eps.get(endpoint)
        if ep is None:
            return
        lru, bit = ep.lru, 1 << ep.bit
        for h in hashes:
            if lru.pop(h, _ABSENT) != _ABSENT:
                self._unset(h, bit)
        if not lru:
            self._release(endpoint, ep)

    def clear_sync(self, endpoint: EndpointId) -> None:
        """Synchronous ``clear``."""
        ep = self._eps.get(endpoint)
        if ep is None:
            return
        bit = 1 << ep.bit
        for h in ep.lru:
            self._unset(h, bit)
        ep.lru.clear()
        self._release(endpoint, ep)

    def entries(self, endpoint: EndpointId) -> int:
        """How many blocks ``endpoint`` has in the index (expired but not yet reclaimed ones included)."""
        ep = self._eps.get(endpoint)
        return 0 if ep is None else len(ep.lru)

    def endpoints(self) -> frozenset[EndpointId]:
        """Endpoints with at least one entry."""
        return frozenset(self._eps)

    def blocks(self) -> int:
        """Distinct block hashes held by anyone."""
        return len(self._masks)

    # -- internals ---------------------------------------------------------------------------------------------

    def _add_endpoint(self, endpoint: EndpointId) -> _Endpoint:
        if self._free_bits:
            bit = self._free_bits.pop()
            self._by_bit[bit] = endpoint
        else:
            bit = len(self._by_bit)
            self._by_bit.append(endpoint)
        ep = self._eps[endpoint] = _Endpoint(bit)
        return ep

    def _release(self, endpoint: EndpointId, ep: _Endpoint) -> None:
        """An endpoint with no entries gives its bit back (no mask has it set any more)."""
        del self._eps[endpoint]
        self._by_bit[ep.bit] = None
        self._free_bits.append(ep.bit)

    def _drop_expired(self, endpoint: EndpointId, ep: _Endpoint, now: float) -> None:
        """Drop every expired entry: from the LRU's old end (in expiry order but for late entries), then the
        late ones from their heap. Releases the endpoint if nothing is left."""
        lru, bit = ep.lru, 1 << ep.bit
        while lru:
            h = next(iter(lru))
            if lru[h] > now:
                break
            del lru[h]
            self._unset(h, bit)
        late = ep.late
        while late and late[0][0] <= now:
            expires, h = heapq.heappop(late)
            if lru.get(h) == expires:  # not refreshed or removed since
                del lru[h]
                self._unset(h, bit)
        if not lru:
            self._release(endpoint, ep)

    def _unset(self, h: BlockHash, bit: int) -> None:
        mask = self._masks[h] & ~bit
        if mask:
            self._masks[h] = mask
        else:
            del self._masks[h]


def _held_prefix(runs: list[int], bit: int) -> int:
    """How many of ``runs`` (non-increasing sets, as masks) contain ``bit``: they form a prefix, so bisect."""
    lo, hi = 0, len(runs)
    while lo < hi:
        mid = (lo + hi) // 2
        if runs[mid] & bit:
            lo = mid + 1
        else:
            hi = mid
    return lo
