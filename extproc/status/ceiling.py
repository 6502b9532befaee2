"""The cached-share ceiling: what share of prompt tokens an infinite prefix cache would have hit.

The benchmark's ``ceiling_cached_share`` (``bench/suite/workloads.py``), live: a request's leading full blocks
whose hash was seen before (in any earlier request of the same hash scheme; the block hashes chain, so a hash
names its whole prefix), never its last prompt token, over its prompt tokens. Comparing the router's
predicted hit rate with it says how much a better placement could still win: near the ceiling, only more
cache (or more reuse in the workload) helps.

An estimate, bounded in memory and CPU: the set of seen hashes keeps the most recently seen ``max_blocks``
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
        seen, hitting = self._seen, True
        for i, h in enumerate(req.block_hashes):
            if hitting and i < cacheable and h in seen:
                totals.hit_tokens += req.block_size
            else:
                hitting = False
            seen.pop(h, None)  # re-inserted last: most recently seen
            seen[h] = None
        while len(seen) > self._max:
            del seen[next(iter(seen))]
