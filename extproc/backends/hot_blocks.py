"""Per endpoint, the blocks its recent cache hits came from: the part of its prefix cache a copy must not evict.

A prefix cache that has served a while is full (vLLM keeps every freed block until it needs the space), but most
of it is dead weight: each request's own question and answer, used once. What a spill must not push out is the
*hot* part, the blocks that requests are hitting. A block stays hot while fewer than ``capacity`` blocks have
been stored on the endpoint since its last hit: vLLM evicts least recently used first, so that is exactly how
long an unreused block survives. No window to tune: the endpoint's own capacity and store rate set it.

Fed by the decider once per decision (``routed``), and with replicas sharing Redis by the other replicas'
decisions too (``heard``; ``redis.touches``), read per candidate (``hot``, ``hits``: how often the
request's deepest cached block was hit there, the reuse a copy of that prefix is spread over; ``hit_gap_s``: how
far apart those hits came, so how many of them a momentary queue would have met). Kept to what the
engine still holds by its KV events (a ``CacheObserver`` of ``kvcache.gate.ObservedWrites``): an evicted block
is not hot, and a cleared cache (``AllBlocksCleared``, a purge) or an endpoint that left has no hot blocks.
Without that, the hot sets of a cache that was reset outlived it, read as full on every endpoint, and cold
placement fell back to the momentary estimate: the spill cascade's last cause (``docs/scheduling.md``). Not
thread-safe: the event loop.

Kept as a tree of *runs* (a radix tree), so a request costs the runs on its path and its new blocks, not every
block of its prompt (an agent's context of 6,000 blocks grows by a few dozen per call). Every hot block got
there on a prompt's path from its first block, and block hashes commit to their parents, so the hot set is a
tree closed under parents. A run is a stretch of one path whose blocks share their hit count and their last
hit; runs split where a request's path or its hits end. Shapes, per endpoint::

    runs:   {block_hash: the _Run holding it}
    depth:  {block_hash: its position in the prompt}      # "block i is hot" is a lookup, the hot prefix a bisection
    leaves: heap of (call, -end position, id, run)       # runs without children, least recently hit first

Recency, as vLLM's LRU evicts: a block's is its last hit, and within one request a block nearer the prompt's
start is more recent; a run is never more recent than its parent, so the least recent block is the tail of the
least recent leaf, where pruning takes it. A block the engine evicts (``removed``) takes the blocks after it
on their paths along: a prefix with a hole cannot be hit past the hole.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from extproc.types import BlockHash, EndpointId, Touch


@dataclass(eq=False, slots=True)
class _Run:
    """Consecutive blocks of one path (``blocks``, from prompt position ``start``) hit equally often (``count``)
    and last hit by the same request (``call``, when ``stored`` was ``stamp``)."""

    blocks: list[BlockHash]
    start: int
    parent: _Run | None
    count: int
    call: int
    stamp: int
    since_s: float  # when its blocks became hot (a hit or a placement), on the clock
    base: int  # its count then: the hits after it are ``count - base``, over the time since ``since_s``
    children: list[_Run] = field(default_factory=list)
    alive: bool = True

    @property
    def end(self) -> int:
        return self.start + len(self.blocks)


@dataclass(slots=True)
class _Endpoint:
    stored: int = 0  # blocks stored on the endpoint so far (our routed uncached blocks)
    calls: int = 0  # requests routed here so far: the recency clock
    runs: dict[BlockHash, _Run] = field(default_factory=dict)
    depth: dict[BlockHash, int] = field(default_factory=dict)
    leaves: list[tuple[int, int, int, _Run]] = field(default_factory=list)


class HotBlocks:
    """Blocks hit on each endpoint that its LRU has not cycled past yet (``capacity`` gives the endpoint's
    KV blocks; ``None``: unknown, nothing is tracked and ``hot`` is ``None``)."""

    def __init__(
        self,
        capacity: Callable[[EndpointId], int | None],
        clock: Callable[[], float] = time.monotonic,
        *,
        on_touch: Callable[[Touch], None] | None = None,
    ) -> None:
        """``on_touch``: told what each request routed here did (``routed``), for the other replicas."""
        self._capacity = capacity
        self._clock = clock
        self._on_touch = on_touch
        self._eps: dict[EndpointId, _Endpoint] = {}
        self._ids = itertools.count()  # heap tie-breaker: runs do not compare

    def routed(self, endpoint: EndpointId, hashes: Sequence[BlockHash], cached_blocks: int, *, placed: bool) -> None:
        """A request went to ``endpoint``: its first ``cached_blocks`` blocks were hits, the rest are stored.
        ``placed``: a cold prompt placed there (a new prefix, reason ``load``): all its blocks count as hot at
        once, so that a burst of new prefixes is spread before their second requests arrive."""
        cap = self._capacity(endpoint)
        if cap is None:
            return
        length = len(hashes) if placed else min(cached_blocks, len(hashes))
        hit, stored = min(cached_blocks, length), max(len(hashes) - cached_blocks, 0)
        self._apply(endpoint, cap, hashes, length, hit, stored)
        if self._on_touch is not None:
            self._on_touch(Touch(endpoint, hashes[:length], hit, stored))

    def heard(self, touch: Touch) -> None:
        """Another replica routed a request to ``touch.endpoint``: count it as if this one had (``routed``), so
        that every replica's hot sets see the whole fleet's traffic. Not told to ``on_touch``."""
        cap = self._capacity(touch.endpoint)
        if cap is not None:
            hit = min(touch.hit_blocks, len(touch.path))
            self._apply(touch.endpoint, cap, touch.path, len(touch.path), hit, touch.stored_blocks)

    def _apply(
        self, endpoint: EndpointId, cap: int, hashes: Sequence[BlockHash], length: int, hit: int, stored: int
    ) -> None:
        ep = self._eps.setdefault(endpoint, _Endpoint())
        ep.stored += stored
        ep.calls += 1
        if length:
            self._touch(ep, hashes, length, hit)
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
        return len(ep.runs)

    def hits(self, endpoint: EndpointId, block: BlockHash) -> int:
        """Requests routed to ``endpoint`` that hit ``block`` while it stayed hot: how often that prefix is reused
        there (0: never hit, or no longer hot)."""
        ep = self._eps.get(endpoint)
        run = ep.runs.get(block) if ep is not None else None
        return run.count if run is not None else 0

    def hit_gap_s(self, endpoint: EndpointId, block: BlockHash) -> float:
        """Mean seconds between the hits of ``block`` on ``endpoint`` since it became hot: the time since then
        over the hits after it (``math.inf``: none after it, or not hot). How soon the prefix is used again."""
        ep = self._eps.get(endpoint)
        run = ep.runs.get(block) if ep is not None else None
        if run is None or run.count <= run.base:
            return math.inf
        return max(self._clock() - run.since_s, 0.0) / (run.count - run.base)

    def tracked(self, endpoint: EndpointId, block: BlockHash) -> bool:
        """Whether ``block`` is in ``endpoint``'s hot set: hit there, or placed there as a new prefix, and not
        cycled out since. A block an earlier request only stored (its uncached tail) is not."""
        ep = self._eps.get(endpoint)
        return ep is not None and block in ep.runs

    def removed(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """The engine evicted ``hashes`` (``BlockRemoved``): they are no longer cached there, so not hot, and
        neither are the blocks after them on their paths."""
        ep = self._eps.get(endpoint)
        if ep is None:
            return
        for h in hashes:
            run = ep.runs.get(h)
            if run is not None:
                self._cut(ep, run, ep.depth[h] - run.start)

    def stored(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """The engine stored ``hashes`` (``BlockStored``): nothing to do, a block becomes hot by a hit, and what
        was stored is counted from our own routing (``routed``)."""

    def cleared(self, endpoint: EndpointId) -> None:
        """The endpoint left, or its cache was cleared (``AllBlocksCleared``, a purge)."""
        self._eps.pop(endpoint, None)

    # -- the tree --------------------------------------------------------------------------------------------

    def _touch(self, ep: _Endpoint, hashes: Sequence[BlockHash], length: int, hit: int) -> None:
        """``hashes[:length]`` were just hit or placed, ``hashes[:hit]`` hit: refresh the runs on that path (one
        more hit where they were hit) and add the blocks that were not hot."""
        held = _held(ep.depth, hashes, length)
        for at in (hit, held, length):  # runs end where the hits, the known path and the refreshed path end
            if 0 < at <= held:
                self._split_after(ep, hashes[at - 1])
        call, stamp = ep.calls, ep.stored
        deepest = ep.runs[hashes[held - 1]] if held else None
        run = deepest
        while run is not None:
            run.call, run.stamp = call, stamp
            run.count += run.end <= hit
            run = run.parent
        for lo, hi, count in ((held, max(held, hit), 1), (max(held, hit), length, 0)):
            if lo < hi:
                deepest = self._add(ep, hashes, lo, hi, deepest, count)
        if deepest is not None and not deepest.children:
            self._push(ep, deepest)

    def _add(
        self, ep: _Endpoint, hashes: Sequence[BlockHash], lo: int, hi: int, parent: _Run | None, count: int
    ) -> _Run:
        """A new run of ``hashes[lo:hi]`` under ``parent``, hit by the current call."""
        blocks = list(hashes[lo:hi])
        run = _Run(blocks, lo, parent, count, ep.calls, ep.stored, self._clock(), count)
        if parent is not None:
            parent.children.append(run)
        runs, depth = ep.runs, ep.depth
        for i, h in enumerate(blocks, lo):
            runs[h] = run
            depth[h] = i
        return run

    def _split_after(self, ep: _Endpoint, block: BlockHash) -> None:
        """Make ``block`` the last block of its run (the rest becomes its only child, keeping its children)."""
        run = ep.runs[block]
        cut = ep.depth[block] - run.start + 1
        if cut == len(run.blocks):
            return
        tail = _Run(
            run.blocks[cut:], run.start + cut, run, run.count, run.call, run.stamp, run.since_s, run.base, run.children
        )
        del run.blocks[cut:]
        for child in tail.children:
            child.parent = tail
        run.children = [tail]
        runs = ep.runs
        for h in tail.blocks:
            runs[h] = tail
        if not tail.children:
            self._push(ep, tail)

    def _prune(self, ep: _Endpoint, cap: int) -> None:
        """Least recently hit blocks first: every block hit ``cap`` stored blocks ago or more, then the oldest
        until at most ``cap`` remain."""
        leaves = ep.leaves
        while leaves:
            call, neg_end, _, run = leaves[0]
            if not (run.alive and not run.children and run.call == call and run.end == -neg_end):
                heapq.heappop(leaves)  # refreshed, cut or grown since it was pushed
                continue
            if ep.stored - run.stamp >= cap:
                drop = len(run.blocks)
            elif len(ep.runs) > cap:
                drop = min(len(run.blocks), len(ep.runs) - cap)
            else:
                return
            heapq.heappop(leaves)
            self._cut(ep, run, len(run.blocks) - drop)

    def _cut(self, ep: _Endpoint, run: _Run, keep: int) -> None:
        """Drop ``run``'s blocks from offset ``keep`` on, and every run below it."""
        runs, depth = ep.runs, ep.depth
        below, run.children = run.children, []
        for h in run.blocks[keep:]:
            del runs[h], depth[h]
        del run.blocks[keep:]
        while below:
            gone = below.pop()
            gone.alive = False
            for h in gone.blocks:
                del runs[h], depth[h]
            below += gone.children
        if run.blocks:
            self._push(ep, run)
            return
        run.alive = False
        parent = run.parent
        if parent is not None:
            parent.children.remove(run)
            if not parent.children:
                self._push(ep, parent)

    def _push(self, ep: _Endpoint, run: _Run) -> None:
        heapq.heappush(ep.leaves, (run.call, -run.end, next(self._ids), run))


def _held(depth: dict[BlockHash, int], hashes: Sequence[BlockHash], length: int) -> int:
    """How many leading ``hashes`` (of the first ``length``) are hot: a bisection, the set being closed under
    parents (module docstring)."""
    if length and depth.get(hashes[length - 1]) == length - 1:
        return length
    lo, hi = 0, length
    while lo < hi:
        mid = (lo + hi) // 2
        if depth.get(hashes[mid]) == mid:
            lo = mid + 1
        else:
            hi = mid
    return lo
