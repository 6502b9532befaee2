"""A small fleet for the status page and fleet-metrics tests: two endpoints over a fake clock.

``A`` (``10.0.0.1:8000``) has its KV events followed (connected, precise), ``B`` (``10.0.0.2:8000``) does not;
both are in an ``EndpointRegistry``; the indexes are real ``MemoryPrefixIndex``es, the tap a real
``DecisionTap`` (tenant ``gold`` is a configured class). ``decide(...)`` feeds the tap one decision as
``Router._observe`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from extproc.backends.inflight import InflightLoad
from extproc.backends.registry import EndpointRegistry
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.subscriber import StreamStatus
from extproc.status.ceiling import CeilingEstimator
from extproc.status.tap import DecisionTap, tenant_classes
from extproc.status.view import Sources
from extproc.types import BlockHash, Decision, Endpoint, EndpointId, Reason, RoutingRequest, Tenant
from tests.support.clock import FakeClock

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


@dataclass
class Fleet:
    clock: FakeClock
    registry: EndpointRegistry
    inflight: InflightLoad
    precise: MemoryPrefixIndex
    approx: MemoryPrefixIndex
    tap: DecisionTap
    sources: Sources
    streams: dict[EndpointId, StreamStatus] = field(default_factory=dict)
    blocks: dict[EndpointId, tuple[int, int]] = field(default_factory=dict)

    def scrape(self, eid: EndpointId, **fields: object) -> None:
        """A good scrape of ``eid`` now (``EngineMetrics`` fields; idle by default)."""
        values: dict[str, object] = {"running": 0, "waiting": 0, "kv_usage": 0.0, "models": frozenset({"m"})}
        self.registry.scraped(eid, EngineMetrics(**{**values, **fields}))  # type: ignore[arg-type]


def make_fleet() -> Fleet:
    clock = FakeClock()
    registry = EndpointRegistry([Endpoint(A, frozenset({"m"})), Endpoint(B, frozenset({"m"}))], clock=clock)
    inflight = InflightLoad(1.0, clock=clock)
    precise, approx = MemoryPrefixIndex(), MemoryPrefixIndex()
    tap = DecisionTap(tenant_classes(["gold"]), CeilingEstimator(), clock=lambda: 1_700_000_000.0)
    streams: dict[EndpointId, StreamStatus] = {}
    blocks: dict[EndpointId, tuple[int, int]] = {}
    sources = Sources(
        registry, inflight, streams.get,
        lambda: frozenset(e for e, s in streams.items() if s.connected and s.trusted and not s.cold),
        lambda e: blocks.get(e, (0, 0)), {"precise": precise, "approx": approx}, tap, clock=clock,
        wall_clock=lambda: 1_700_000_000.0,
    )  # fmt: skip
    return Fleet(clock, registry, inflight, precise, approx, tap, sources, streams, blocks)


def decide(
    tap: DecisionTap,
    endpoint: EndpointId,
    prompt_tokens: int,
    cached_tokens: int,
    *,
    hashes: Sequence[int] = (),
    tenant: str = "",
    model: str = "m",
    reason: Reason = Reason.CACHE,
    request_id: str = "req",
    estimates_s: dict[EndpointId, float] | None = None,
) -> None:
    routing = RoutingRequest(request_id, model, model, None, prompt_tokens, [BlockHash(h) for h in hashes], 16,
                             tenant=Tenant(tenant))  # fmt: skip
    tap.decided(routing, Decision((endpoint,), reason, cached_tokens, estimates_s=estimates_s or {}))
