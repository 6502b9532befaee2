"""The cached-share ceiling: what share of prompt tokens an infinite prefix cache would have hit.

The benchmark's ``ceiling_cached_share`` (``bench/suite/workloads.py``), live: a request's leading full blocks
whose hash was seen before (in any earlier request of the same hash scheme; the block hashes chain, so a hash
names its whole prefix), never its last prompt token, over its prompt tokens. Comparing the router's
predicted hit rate with it says how much a better placement could still win: near the ceiling, only more
cache (or more reuse in the workload) helps.

An estimate, bounded in memory and CPU: beyond a prompt's first ``EXACT_BLOCKS`` only every ``MARK_STRIDE``-th
block is remembered and looked up (a hit run is then counted to the last such mark: under by fewer than
``MARK_STRIDE`` blocks); the set of seen hashes keeps the most recently seen ``max_blocks``
(older prefixes fall out, as they would from any real cache); the tap drops requests when the loop falls
behind (``DecisionTap.ceiling_dropped``), and a dropped request's blocks are not remembered either, so a
busy router *under*-estimates the ceiling. Requests without block hashes (tokenization failed, index off)
count as prompt tokens that could not hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extproc.types import BlockHash

DEFAULT_MAX_BLOCKS = 1 << 18  # ~25 MiB of seen hashes
EXACT_BLOCKS = 64  # every one of a prompt's first blocks is remembered: the estimate is exact up to here
MARK_STRIDE = 8  # beyond them every 8th: a 2K-block prompt costs ~330 set updates, not 2K (under by < 8 blocks)


def _marks(blocks: int) -> list[int]:
    """The block positions every request remembers and looks up: all of the first ``EXACT_BLOCKS``, then
    every ``MARK_STRIDE``-th. The same positions for every request keep "seen" monotone along a chain."""
    return [*range(min(blocks, EXACT_BLOCKS)), *range(EXACT_BLOCKS + MARK_STRIDE - 1, blocks, MARK_STRIDE)]


@dataclass(frozen=True, slots=True)
class CeilingRequest:
    model: str
    tenant_class: str
    prompt_tokens: int
    block_hashes: Sequence[BlockHash]
    block_size: int


@dataclass(slots=True)
class CeilingTotals:
    """Over the requests the estimator saw: prompt tokens, and those an infinite cache would have hit."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0

    @property
    def share(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None


class CeilingEstimator:
    """``add`` requests in arrival order; ``totals`` per (model, tenant class)."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self._max = max_blocks
        self._seen: dict[BlockHash, None] = {}  # insertion-ordered: the first key is the least recently seen
        self.totals: dict[tuple[str, str], CeilingTotals] = {}

    def add(self, req: CeilingRequest) -> None:
        """Count ``req`` against what was seen before it, then remember its blocks."""
        key = (req.model, req.tenant_class)
        totals = self.totals.get(key)
        if totals is None:
            totals = self.totals[key] = CeilingTotals()
        totals.requests += 1
        totals.prompt_tokens += req.prompt_tokens
        cacheable = max(req.prompt_tokens - 1, 0) // req.block_size if req.block_size else 0
        hashes = req.block_hashes
        marks = _marks(len(hashes))
        seen = self._seen
        # The leading hit run ends at the last mark already seen: a chained hash names its whole prefix, and
        # every request remembers the same marks, so "seen" holds for a prefix of the marks (binary search).
        lo, hi = 0, len(marks)
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[marks[mid]] in seen:
                lo = mid + 1
            else:
                hi = mid
        hit_blocks = min(marks[lo - 1] + 1 if lo else 0, cacheable)
        totals.hit_tokens += hit_blocks * req.block_size
        for i in marks:
            h = hashes[i]
            seen.pop(h, None)  # re-inserted last: most recently seen
            seen[h] = None
        while len(seen) > self._max:
            del seen[next(iter(seen))]
