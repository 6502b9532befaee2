"""The approximate index in memory: our own routing's guesses, kept as root chains, linear in what is *new*.

Every guess is a prompt's blocks from its first (``LocalDecider`` stores them with ``Chain.from_root()``), and a
block hash commits to its parent's, so one endpoint's held blocks form a tree of root chains: each held block's
parent is held. Two things follow, and make this index cheap where ``MemoryPrefixIndex`` walks every block:

* ``match`` is a binary search per endpoint: "block ``i`` of the prompt is held, after block ``i - 1``" is true
  for a leading run of ``i`` and false after it, so O(log blocks) lookups answer it, not O(blocks);
* ``store`` touches only the blocks the endpoint did not hold (found by the same search), plus one *chain end*
  per store: recency and expiry are kept per chain end, not per block.

Data shapes, per endpoint::

    parent: {block_hash: parent block_hash | None}    # every held block (None: a prompt's first block)
    kids:   {block_hash: held children}               # only blocks with at least one
    ends:   OrderedDict{block_hash: expires_at}       # the last block of each store, least recently stored first
    late:   [(expires_at, block_hash)]                # heap: ends stored with an earlier expiry than one before

What it keeps equals a per-block LRU (as ``MemoryPrefixIndex`` keeps it) given the same root-chain stores:

* recency: a block's is that of the latest store through it, and within one store a block nearer the prompt's
  start is more recent (capacity evicts a prompt's tail first, as vLLM frees a request's blocks tail first). The
  least recent blocks are therefore the tail of the least recently stored chain end, up to the first block that a
  more recent store also holds (one with children, or another end): eviction walks back from that end;
* expiry: a block expires with the *latest-expiring* store through it (``MemoryPrefixIndex`` takes the latest
  store's; the two differ only when an endpoint's guesses switch to a shorter TTL, e.g. when its KV events come
  alive, and then only for the blocks the new guesses do not extend). Expired ends are dropped the same way,
  from the LRU's old end and the ``late`` heap, before every read and write of the endpoint.

Either way an evicted or expired block takes no held descendant with it (each descendant is older, or expires
no later), so the tree stays closed under parents and the binary search stays exact. An end superseded by a
longer store through it (an agent's previous turn) is dropped at once when that store expires no earlier;
others are dropped when they reach the LRU's old end.

Costs: ``store`` O(log n + new blocks), ``match`` O(endpoints × log n), eviction O(evicted blocks), ``clear``
O(its blocks). Not thread-safe: use it from one event loop. ``remove`` is not offered: guesses are never removed
block by block (engines' evictions go to the precise index).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence

from extproc.kvcache.index import Chain
from extproc.kvcache.memory_index import CapacityFn, capacity_of
from extproc.types import BlockHash, EndpointId

__all__ = ["ChainIndex"]

_ABSENT = object()  # not a held block (a held block's parent may be None)
_FROM_ROOT = Chain.from_root()


class _Chains:
    """One endpoint's held root chains (module docstring: shapes)."""

    __slots__ = ("ends", "kids", "late", "max_expires", "parent")

    def __init__(self) -> None:
        self.parent: dict[BlockHash, BlockHash | None] = {}
        self.kids: dict[BlockHash, int] = {}
        self.ends: OrderedDict[BlockHash, float] = OrderedDict()
        self.late: list[tuple[float, BlockHash]] = []
        self.max_expires = -math.inf  # the latest expiry ever stored: a store expiring before it is "late"

    def held(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading ``hashes`` are held, each after the one before it: a binary search (module docstring;
        exact for a prompt's hashes from its first block, whose chain fixes every block's parent)."""
        parent = self.parent
        lo, hi = 0, len(hashes)  # hashes[:lo] held; hashes[hi:] not
        if hi and parent.get(hashes[hi - 1], _ABSENT) == (hashes[hi - 2] if hi > 1 else None):
            return hi  # the whole prompt (a repeat): one lookup
        while lo < hi:
            mid = (lo + hi) // 2
            if parent.get(hashes[mid], _ABSENT) == (hashes[mid - 1] if mid else None):
                lo = mid + 1
            else:
                hi = mid
        return lo


class ChainIndex:
    """Implements ``GuessIndex``: the approximate index in this process's memory (module docstring).

    ``capacity_blocks``: ``None`` (unbounded), one bound for every endpoint, or a function giving each endpoint's
    bound (called on every ``store``; ``None`` means unbounded). ``clock``: monotonic seconds, injectable.
    """

    def __init__(
        self, *, capacity_blocks: int | CapacityFn | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if isinstance(capacity_blocks, int) and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self._capacity = capacity_blocks
        self._clock = clock
        self._eps: dict[EndpointId, _Chains] = {}
        self._holders: dict[BlockHash, int] = {}  # {block_hash: endpoints holding it}, for ``blocks()``

    # -- GuessIndex --------------------------------------------------------------------------------------------

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
        """Record that ``endpoint`` holds ``hashes``, a prompt's blocks from its first (``chain`` may say so; it
        may not claim anything else: ``ValueError``). Refreshes recency and expiry; evicts beyond capacity."""
        if chain is not None and chain != _FROM_ROOT:
            raise ValueError("ChainIndex holds prompts' blocks from their first only (Chain.from_root())")
        self.store_sync(endpoint, hashes, ttl_s=ttl_s)

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint``."""
        self.clear_sync(endpoint)

    async def close(self) -> None:
        """Drop all entries."""
        self._eps.clear()
        self._holders.clear()

    # -- synchronous core --------------------------------------------------------------------------------------

    def match_sync(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> dict[EndpointId, int]:
        """Synchronous ``match``."""
        if not hashes:
            return {}
        now = self._clock()
        result: dict[EndpointId, int] = {}
        for e in set(endpoints):
            ep = self._live(e, now)
            if ep is not None:
                n = ep.held(hashes)
                if n:
                    result[e] = n
        return result

    def store_sync(self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None) -> None:
        """Synchronous ``store`` (``hashes`` from the prompt's first block)."""
        if not hashes:
            return
        now = self._clock()
        expires = math.inf if ttl_s is None else now + ttl_s
        ep = self._live(endpoint, now) or self._eps.setdefault(endpoint, _Chains())
        held = ep.held(hashes)
        stored = self._add(ep, hashes, held)
        if stored == 0:  # its first block is held after another parent: not a prompt's first block
            if not ep.parent:
                del self._eps[endpoint]
            return
        end = hashes[stored - 1]
        if 0 < held < stored:  # the store extends a held chain: an end there is superseded if it expires no later
            previous = hashes[held - 1]
            superseded = ep.ends.get(previous)
            if superseded is not None and superseded <= expires:
                del ep.ends[previous]
        self._touch_end(ep, end, expires)
        cap = capacity_of(self._capacity, endpoint)
        if cap is not None:
            self._evict_beyond(ep, cap)
        if not ep.parent:
            del self._eps[endpoint]

    def clear_sync(self, endpoint: EndpointId) -> None:
        """Synchronous ``clear``."""
        ep = self._eps.pop(endpoint, None)
        if ep is not None:
            for h in ep.parent:
                self._unhold(h)

    def entries(self, endpoint: EndpointId) -> int:
        """How many blocks ``endpoint`` has in the index (expired but not yet reclaimed ones included)."""
        ep = self._eps.get(endpoint)
        return 0 if ep is None else len(ep.parent)

    def endpoints(self) -> frozenset[EndpointId]:
        """Endpoints with at least one entry."""
        return frozenset(self._eps)

    def blocks(self) -> int:
        """Distinct block hashes held by anyone."""
        return len(self._holders)

    # -- internals ---------------------------------------------------------------------------------------------

    def _add(self, ep: _Chains, hashes: Sequence[BlockHash], held: int) -> int:
        """Add ``hashes[held:]`` after the held run; returns how many leading blocks are now held (fewer than
        ``len(hashes)`` only if a block is already held after another parent: not a chain, the rest is ignored)."""
        parent, holders = ep.parent, self._holders
        before = hashes[held - 1] if held else None
        for i in range(held, len(hashes)):
            h = hashes[i]
            if h in parent:
                return i
            parent[h] = before
            holders[h] = holders.get(h, 0) + 1
            if before is not None:
                ep.kids[before] = ep.kids.get(before, 0) + 1
            before = h
        return len(hashes)

    def _touch_end(self, ep: _Chains, end: BlockHash, expires: float) -> None:
        """``end`` is the most recently stored chain end now, expiring at the later of its two expiries."""
        ends = ep.ends
        expires = max(expires, ends.pop(end, -math.inf))
        ends[end] = expires
        if expires < ep.max_expires:
            heapq.heappush(ep.late, (expires, end))
        else:
            ep.max_expires = expires

    def _live(self, endpoint: EndpointId, now: float) -> _Chains | None:
        """``endpoint``'s chains with every expired end dropped (None if nothing is left)."""
        ep = self._eps.get(endpoint)
        if ep is None:
            return None
        ends = ep.ends
        while ends:
            end, expires = next(iter(ends.items()))
            if expires > now:
                break
            del ends[end]
            self._drop_chain(ep, end)
        late = ep.late
        while late and late[0][0] <= now:
            expires, end = heapq.heappop(late)
            if ends.get(end) == expires:  # not refreshed or dropped since
                del ends[end]
                self._drop_chain(ep, end)
        if not ep.parent:
            del self._eps[endpoint]
            return None
        return ep

    def _drop_chain(self, ep: _Chains, end: BlockHash, expires: float = math.inf, limit: float = math.inf) -> None:
        """Remove the chain ending at ``end`` (its entry already gone) back to the first block a more recent store
        holds (one with children, or another end), at most ``limit`` blocks. A chain cut short by ``limit`` stays
        the least recently stored one, ending at its new tail, expiring at ``expires``."""
        parent, kids, ends = ep.parent, ep.kids, ep.ends
        block: BlockHash | None = end
        removed = 0
        while block is not None and block not in kids and block not in ends and block in parent:
            if removed >= limit:
                ends[block] = expires
                ends.move_to_end(block, last=False)
                if expires < ep.max_expires:
                    heapq.heappush(ep.late, (expires, block))
                return
            up = parent.pop(block)
            self._unhold(block)
            removed += 1
            if up is not None:
                left = kids[up] - 1
                if left:
                    kids[up] = left
                else:
                    del kids[up]
            block = up

    def _evict_beyond(self, ep: _Chains, cap: int) -> None:
        """Least recently stored blocks first, until ``ep`` holds at most ``cap``."""
        while len(ep.parent) > cap and ep.ends:
            end, expires = ep.ends.popitem(last=False)
            self._drop_chain(ep, end, expires, limit=len(ep.parent) - cap)

    def _unhold(self, h: BlockHash) -> None:
        left = self._holders[h] - 1
        if left:
            self._holders[h] = left
        else:
            del self._holders[h]
