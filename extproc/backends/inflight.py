"""Load we caused but no scrape shows yet: a per-endpoint virtual prefill queue.

Each routed request adds its uncached prompt tokens to the endpoint's queue, which drains at the endpoint's
prefill rate. A burst therefore raises the chosen endpoint's estimate immediately, between scrapes, so the next
request of the burst does not land on the same "idle" backend. Requests routed since the last scrape are also
counted, so the scraped waiting count can be corrected until the next scrape sees them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from extproc.types import EndpointId


@dataclass(slots=True)
class _Queue:
    tokens: float = 0.0
    updated_s: float = 0.0
    routed_since_scrape: int = 0


class InflightLoad:
    """Per-endpoint virtual queue of uncached prefill tokens, draining at ``prefill_tokens_per_s``."""

    def __init__(self, prefill_tokens_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = prefill_tokens_per_s
        self._clock = clock
        self._queues: dict[EndpointId, _Queue] = {}
        self._mean_uncached = 0.0

    def _drained(self, endpoint: EndpointId) -> _Queue:
        now = self._clock()
        q = self._queues.setdefault(endpoint, _Queue(updated_s=now))
        q.tokens = max(0.0, q.tokens - self._rate * (now - q.updated_s))
        q.updated_s = now
        return q

    def add(self, endpoint: EndpointId, uncached_tokens: int) -> None:
        """Called once per routed request, right after the decision."""
        q = self._drained(endpoint)
        q.tokens += uncached_tokens
        q.routed_since_scrape += 1
        self._mean_uncached += 0.05 * (uncached_tokens - self._mean_uncached)

    def scraped(self, endpoint: EndpointId) -> None:
        """Called when a fresh scrape of ``endpoint`` arrived: it now shows what we routed before."""
        self._drained(endpoint).routed_since_scrape = 0

    def queued_tokens(self, endpoint: EndpointId) -> float:
        return self._drained(endpoint).tokens

    def routed_since_scrape(self, endpoint: EndpointId) -> int:
        q = self._queues.get(endpoint)
        return q.routed_since_scrape if q else 0

    @property
    def mean_uncached_tokens(self) -> float:
        """Running mean of uncached tokens per routed request: the size of a waiting request we didn't send."""
        return self._mean_uncached

    def forget(self, endpoint: EndpointId) -> None:
        self._queues.pop(endpoint, None)
