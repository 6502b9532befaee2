"""``gather``: the fleet as the scheduler sees it, read from in-memory state into one frozen ``FleetView``.

No I/O and no awaits: it reads the registry's snapshot, the in-flight load, the event streams' status, the
in-memory indexes' sizes and the decision tap. When: per ``/metrics`` scrape (``FleetCollector``) and per
``/status`` view; each call also samples the counters into ``Sources.windows``, so rates and windowed
ratios cover the last ``WINDOW_S`` seconds of views.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from extproc.backends.registry import EndpointRecord, EndpointRegistry
from extproc.backends.vllm_metrics import PhaseTotals
from extproc.kvcache.subscriber import StreamStatus
from extproc.status.ceiling import CeilingTotals
from extproc.status.tap import DecisionTap, RecentDecision, Routed
from extproc.status.windows import Windows, ratio
from extproc.types import EndpointId

PHASES = ("queue", "prefill", "decode")  # engine request phases, as vLLM's histograms name them


class QueuedLoad(Protocol):
    def queued_tokens(self, endpoint: EndpointId) -> float: ...


class IndexSize(Protocol):
    """What an in-memory ``PrefixIndex`` says about its size (``MemoryPrefixIndex``)."""

    def entries(self, endpoint: EndpointId) -> int: ...

    def blocks(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Sources:
    """Where the view is read from; built once by the composition root."""

    registry: EndpointRegistry
    inflight: QueuedLoad
    stream_status: Callable[[EndpointId], StreamStatus | None]  # None: its events are not followed
    precise: Callable[[], frozenset[EndpointId]]  # EventFeed.precise_endpoints
    block_totals: Callable[[EndpointId], tuple[int, int]]  # (stored, removed) from its events
    index_sizes: Mapping[str, IndexSize]  # {"precise" | "approx": in-memory index}
    tap: DecisionTap
    windows: Windows = field(default_factory=Windows)
    stale_after_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time


@dataclass(frozen=True, slots=True)
class StreamRow:
    """One endpoint's KV-event stream."""

    connected: bool
    precise: bool  # the router takes its precise-index entries as the truth now
    trusted: bool
    cold: bool
    writer: bool
    last_seq: int | None
    event_age_s: float | None  # since the last applied batch; None: never
    blocks_stored: int
    blocks_removed: int
    stored_per_s: float | None
    removed_per_s: float | None


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """One endpoint: its scraped load, what we routed there, what its engine and its events say."""

    id: EndpointId
    healthy: bool
    load_known: bool
    running: int
    waiting: int
    kv_usage: float  # 0..1, as last scraped
    queued_prefill_tokens: float  # our virtual queue
    num_gpu_blocks: int | None
    routed: Routed
    engine_hit_tokens: float | None  # cumulative, as the engine reports it; None: never scraped
    engine_queried_tokens: float | None
    phases: Mapping[str, PhaseTotals]  # the engine's cumulative phase times, where it exports them
    index_entries: Mapping[str, int]  # {index name: this endpoint's entries}
    stream: StreamRow | None
    # windowed (the last WINDOW_S of views); None: not known yet
    engine_hit_ratio: float | None = None  # Δengine hits / Δengine queries
    predicted_hit_ratio: float | None = None  # Δpredicted cached / Δrouted prompt tokens
    prediction_ratio: float | None = None  # Δengine hits / Δpredicted cached (1: our predictions hold)
    phase_mean_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def predicted_hit_ratio_total(self) -> float | None:
        """Since the router started: predicted cached / routed prompt tokens."""
        r = self.routed
        return r.predicted_cached_tokens / r.prompt_tokens if r.prompt_tokens else None

    @property
    def engine_hit_ratio_total(self) -> float | None:
        """Since the engine started: its prefix-cache hits / queries (all its traffic)."""
        if not self.engine_queried_tokens or self.engine_hit_tokens is None:
            return None
        return self.engine_hit_tokens / self.engine_queried_tokens

    def phase_mean(self, phase: str) -> float | None:
        """Mean ``phase`` seconds over the window, else since the engine started; None: no such histogram."""
        totals = self.phases.get(phase)
        if totals is None:
            return None
        windowed = self.phase_mean_s.get(phase)
        if windowed is not None:
            return windowed
        return totals.seconds / totals.requests if totals.requests else None

    @property
    def occupancy(self) -> float | None:
        """Share of the engine's KV blocks the index holds for it (precise if its events are followed)."""
        held = self.index_entries.get("precise" if self.stream else "approx")
        if held is None or not self.num_gpu_blocks:
            return None
        return held / self.num_gpu_blocks


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One (model, tenant class): what the router predicted, against the ceiling."""

    model: str
    tenant_class: str
    routed: Routed
    ceiling: CeilingTotals | None

    @property
    def predicted_hit_ratio(self) -> float | None:
        r = self.routed
        return r.predicted_cached_tokens / r.prompt_tokens if r.prompt_tokens else None


@dataclass(frozen=True, slots=True)
class FleetView:
    at_s: float  # wall clock
    endpoints: tuple[EndpointRow, ...]
    models: tuple[ModelRow, ...]
    recent: tuple[RecentDecision, ...]
    decisions_by_reason: Mapping[str, int]
    index_blocks: Mapping[str, int]  # {index name: distinct blocks}
    ceiling_dropped: int
    ceiling_queued: int


def gather(src: Sources) -> FleetView:
    """Read the fleet now (see the module docstring)."""
    now = src.clock()
    states = src.registry.snapshot()
    src.windows.keep(lambda k: not (isinstance(k, tuple) and k[0] == "ep") or k[1] in states)
    tap, precise = src.tap, src.precise()
    models = tuple(ModelRow(m, c, r, tap.ceiling.totals.get((m, c))) for (m, c), r in sorted(tap.by_model.items()))
    return FleetView(
        at_s=src.wall_clock(),
        endpoints=tuple(_endpoint(src, rec, now, precise) for _, rec in sorted(states.items())),
        models=models,
        recent=tuple(tap.recent()),
        decisions_by_reason=dict(tap.by_reason),
        index_blocks={name: index.blocks() for name, index in src.index_sizes.items()},
        ceiling_dropped=tap.ceiling_dropped,
        ceiling_queued=tap.queued(),
    )


def _endpoint(src: Sources, rec: EndpointRecord, now: float, precise: frozenset[EndpointId]) -> EndpointRow:
    eid, m = rec.endpoint.id, rec.metrics
    known = rec.load_known(now, src.stale_after_s)
    routed = src.tap.by_endpoint.get(eid, Routed())
    w = src.windows
    prompt = w.delta(("ep", eid, "prompt"), routed.prompt_tokens, now)
    predicted = w.delta(("ep", eid, "predicted"), routed.predicted_cached_tokens, now)
    phases: dict[str, PhaseTotals] = {}
    means: dict[str, float] = {}
    hits = queries = None
    if m is not None:
        hits = w.delta(("ep", eid, "hits"), m.prefix_cache_hits, now)
        queries = w.delta(("ep", eid, "queries"), m.prefix_cache_queries, now)
        for name, totals in zip(PHASES, (m.queue_time, m.prefill_time, m.decode_time), strict=True):
            if totals is None:
                continue
            phases[name] = totals
            mean = ratio(w.delta(("ep", eid, name, "s"), totals.seconds, now),
                         w.delta(("ep", eid, name, "n"), totals.requests, now))  # fmt: skip
            if mean is not None:
                means[name] = mean
    return EndpointRow(
        id=eid,
        healthy=rec.endpoint.healthy,
        load_known=known,
        running=m.running if m and known else 0,
        waiting=m.waiting if m and known else 0,
        kv_usage=m.kv_usage if m and known else 0.0,
        queued_prefill_tokens=src.inflight.queued_tokens(eid),
        num_gpu_blocks=rec.endpoint.num_gpu_blocks,
        routed=routed,
        engine_hit_tokens=m.prefix_cache_hits if m else None,
        engine_queried_tokens=m.prefix_cache_queries if m else None,
        phases=phases,
        index_entries={name: index.entries(eid) for name, index in src.index_sizes.items()},
        stream=_stream(src, eid, now, eid in precise),
        engine_hit_ratio=ratio(hits, queries),
        predicted_hit_ratio=ratio(predicted, prompt),
        prediction_ratio=ratio(hits, predicted),
        phase_mean_s=means,
    )


def _stream(src: Sources, eid: EndpointId, now: float, precise: bool) -> StreamRow | None:
    st = src.stream_status(eid)
    if st is None:
        return None
    stored, removed = src.block_totals(eid)
    return StreamRow(
        connected=st.connected,
        precise=precise,
        trusted=st.trusted,
        cold=st.cold,
        writer=st.writer,
        last_seq=st.last_seq,
        event_age_s=None if st.last_event_s is None else max(now - st.last_event_s, 0.0),
        blocks_stored=stored,
        blocks_removed=removed,
        stored_per_s=src.windows.rate(("ep", eid, "stored"), stored, now),
        removed_per_s=src.windows.rate(("ep", eid, "removed"), removed, now),
    )
