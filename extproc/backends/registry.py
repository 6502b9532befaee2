"""The endpoint registry: every model server we may route to, with its latest scraped state.

Readers get an immutable snapshot (a mapping swapped whole on each update), so the read path takes no locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from extproc.backends.vllm_metrics import EngineMetrics
from extproc.types import Endpoint, EndpointId


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """One endpoint as the registry last observed it (scrapes, discovery). ``metrics`` is None until a scrape
    succeeds. (Not ``kvcache.ingest.EndpointState``, which is an endpoint's KV-event stream state.)"""

    endpoint: Endpoint
    metrics: EngineMetrics | None = None
    scraped_at_s: float = 0.0  # monotonic time the last good page was taken (its GET sent)
    failures: int = 0  # consecutive failed scrapes (connection or parse)
    unreachable: int = 0  # consecutive connection failures

    def load_known(self, now_s: float, stale_after_s: float) -> bool:
        return self.metrics is not None and now_s - self.scraped_at_s <= stale_after_s


class EndpointRegistry:
    """Holds ``{EndpointId: EndpointRecord}``; updates replace the whole mapping."""

    def __init__(self, endpoints: Iterable[Endpoint], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._states: Mapping[EndpointId, EndpointRecord] = MappingProxyType(
            {e.id: EndpointRecord(e) for e in endpoints}
        )

    def snapshot(self) -> Mapping[EndpointId, EndpointRecord]:
        return self._states

    def sync(self, endpoints: Iterable[Endpoint]) -> None:
        """Make the endpoint set exactly ``endpoints`` (discovery): known ones keep their state, new ones start
        unscraped, absent ones are dropped. Updates for a dropped endpoint are ignored from then on."""
        old = self._states
        self._states = MappingProxyType({e.id: old.get(e.id) or EndpointRecord(e) for e in endpoints})

    def _swap(self, eid: EndpointId, state: EndpointRecord) -> None:
        states = dict(self._states)
        states[eid] = state
        self._states = MappingProxyType(states)

    def scraped(self, eid: EndpointId, metrics: EngineMetrics, taken_at_s: float | None = None) -> None:
        """A scrape succeeded: fresh load, endpoint healthy, KV capacity learned. ``taken_at_s``: when the page was
        taken (its GET sent; the registry's clock); None: now. A page read later than it was taken (a deferred
        read collected at the next round) is as old as its GET, not as its reading."""
        old = self._states.get(eid)
        if old is None:  # dropped by discovery while its scrape was in flight
            return
        endpoint = old.endpoint
        blocks = metrics.num_gpu_blocks or endpoint.num_gpu_blocks
        if not endpoint.healthy or blocks != endpoint.num_gpu_blocks:  # (most pages change neither: no copy)
            endpoint = replace(endpoint, healthy=True, num_gpu_blocks=blocks)
        at_s = self._clock() if taken_at_s is None else taken_at_s
        self._swap(eid, EndpointRecord(endpoint, metrics, at_s, 0, 0))

    def failed(self, eid: EndpointId, *, unreachable: bool, unhealthy_after: int = 2) -> None:
        """A scrape failed. Garbage or slow metrics make the load unknown; only refusals make it unhealthy."""
        old = self._states.get(eid)
        if old is None:
            return
        unreach = old.unreachable + 1 if unreachable else 0
        healthy = unreach < unhealthy_after
        self._swap(
            eid,
            replace(
                old,
                endpoint=replace(old.endpoint, healthy=healthy),
                failures=old.failures + 1,
                unreachable=unreach,
            ),
        )

    def discovered(self, eid: EndpointId, models: frozenset[str], adapters: frozenset[str]) -> None:
        """``/v1/models`` answered: what the endpoint serves."""
        old = self._states.get(eid)
        if old is None:
            return
        self._swap(eid, replace(old, endpoint=replace(old.endpoint, models=models, adapters=adapters)))
