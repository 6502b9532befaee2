"""``DecisionTap``: what the status page and the fleet metrics learn from each decision.

When: ``decided`` is called once per routed request, from ``Router._observe``, on the event loop. It does O(1)
work (a few dict increments, two bounded ring appends) and keeps references, never copies: the request hot
path must not pay for observability. Everything else (ratios, the ceiling, the page) happens when a scrape or
a page view reads it, or when the composition root feeds the ceiling in a scrape round (``drain_ceiling``).

Label cardinality is bounded: endpoints are the registry's, models the configured ones (unknown models are
refused before a decision), and tenants are reported by *class*: a tenant id named in ``tenants.classes``, or
``default`` for every other one (``class_of``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from extproc.status.ceiling import CeilingEstimator, CeilingRequest
from extproc.types import Decision, EndpointId, RoutingRequest

RECENT_DECISIONS = 50  # shown on the status page
CEILING_QUEUE = 4096  # requests waiting for the ceiling's feed; beyond it the oldest are dropped (counted)
CEILING_QUEUE_BLOCKS = 1 << 18  # ... and at most this many block hashes held by them (~12 MiB; long prompts)
_K = TypeVar("_K", bound=Hashable)


@dataclass(slots=True)
class Routed:
    """Totals of what the router sent somewhere (an endpoint, or a model and tenant class) since start."""

    requests: int = 0
    prompt_tokens: int = 0
    predicted_cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RecentDecision:
    """One decision as the status page lists it."""

    at_s: float  # wall clock
    request_id: str
    model: str
    tenant_class: str
    endpoints: tuple[EndpointId, ...]  # pick first, then fallbacks
    reason: str
    prompt_tokens: int
    cached_tokens: int
    estimates_s: dict[EndpointId, float]  # TTFT profile: lower is better
    scores: dict[EndpointId, float]  # weighted profile: higher is better


@dataclass(frozen=True, slots=True)
class _Pending:
    """A decision as the tap keeps it: references only (the request's block hashes are the router's list)."""

    at_s: float
    tenant_class: str
    routing: RoutingRequest
    decision: Decision


class DecisionTap:
    """Per-endpoint and per-(model, tenant class) totals, the last decisions, and the ceiling's input queue."""

    def __init__(
        self,
        class_of: Callable[[str], str],
        ceiling: CeilingEstimator,
        *,
        clock: Callable[[], float] = time.time,
        recent: int = RECENT_DECISIONS,
        queue: int = CEILING_QUEUE,
        queue_blocks: int = CEILING_QUEUE_BLOCKS,
    ) -> None:
        """``class_of``: tenant id → its class label (bounded); ``clock``: wall time for the page."""
        self._class_of = class_of
        self.ceiling = ceiling
        self._clock = clock
        self.by_endpoint: dict[EndpointId, Routed] = {}
        self.by_model: dict[tuple[str, str], Routed] = {}  # {(model, tenant class): totals}
        self.by_reason: dict[str, int] = {}  # {Reason value: decisions}
        self._recent: deque[_Pending] = deque(maxlen=recent)
        self._queue: deque[_Pending] = deque()
        self._queue_max, self._queue_blocks_max = queue, queue_blocks
        self._queued_blocks = 0  # block hashes referenced by the queue
        self.ceiling_dropped = 0  # requests the ceiling never saw (queue full)

    def decided(self, routing: RoutingRequest, decision: Decision) -> None:
        """Count one decision (O(1); see the module docstring)."""
        cls = self._class_of(routing.tenant.id)
        for totals in (self._totals(self.by_endpoint, decision.endpoints[0]),
                       self._totals(self.by_model, (routing.model, cls))):  # fmt: skip
            totals.requests += 1
            totals.prompt_tokens += routing.prompt_tokens
            totals.predicted_cached_tokens += decision.cached_tokens
        reason = decision.reason.value
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        entry = _Pending(self._clock(), cls, routing, decision)
        self._recent.append(entry)
        self._queue.append(entry)
        self._queued_blocks += len(routing.block_hashes)
        # Amortised O(1): each entry is dropped at most once.
        while len(self._queue) > self._queue_max or (self._queued_blocks > self._queue_blocks_max and self._queue):
            self._queued_blocks -= len(self._queue.popleft().routing.block_hashes)
            self.ceiling_dropped += 1

    @staticmethod
    def _totals(table: dict[_K, Routed], key: _K) -> Routed:
        totals = table.get(key)
        if totals is None:
            totals = table[key] = Routed()
        return totals

    def recent(self) -> list[RecentDecision]:
        """The last decisions, newest first."""
        return [_shown(p) for p in reversed(self._recent)]

    def drain_ceiling(self, max_blocks: int) -> None:
        """Feed queued requests to the ceiling estimator, at most ``max_blocks`` block look-ups per call (the
        rest wait for the next call). When: ``FleetStatus.tick``, in a scrape round every ``CEILING_EVERY_S`` or so."""
        budget = max_blocks
        while self._queue and budget > 0:
            p = self._queue.popleft()
            r = p.routing
            budget -= len(r.block_hashes)
            self._queued_blocks -= len(r.block_hashes)
            self.ceiling.add(CeilingRequest(r.model, p.tenant_class, r.prompt_tokens, r.block_hashes, r.block_size))

    def queued(self) -> int:
        return len(self._queue)


def _shown(p: _Pending) -> RecentDecision:
    d, r = p.decision, p.routing
    return RecentDecision(p.at_s, r.request_id, r.model, p.tenant_class, d.endpoints, d.reason.value,
                          r.prompt_tokens, d.cached_tokens, dict(d.estimates_s), dict(d.scores))  # fmt: skip


def tenant_classes(configured: Iterable[str]) -> Callable[[str], str]:
    """``class_of`` for ``DecisionTap``: a configured tenant id is its own class, any other is ``default``."""
    known = frozenset(configured)
    return lambda tenant_id: tenant_id if tenant_id in known else "default"
