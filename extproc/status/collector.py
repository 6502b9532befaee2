"""``FleetCollector``: the fleet view as Prometheus families, built at scrape time (no per-request cost).

Names: ``router_endpoint_*`` (label ``endpoint``), ``router_model_*`` (labels ``model``, ``tenant_class``),
``router_index_*`` and ``router_ceiling_*``; engine figures are re-labelled under our own names, never as
``vllm:*`` (``vllm_metrics.py`` is the one module that knows those). The table, with what to do when a
metric looks wrong, is ``docs/observability.md``; ``deploy/grafana/router-fleet.json`` charts them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from extproc.status.view import PHASES, EndpointRow, FleetView, ModelRow

_EP = ["endpoint"]
_MODEL = ["model", "tenant_class"]
_F = TypeVar("_F", GaugeMetricFamily, CounterMetricFamily)

# (name, help, value of a row or None to skip it); counters get ``_total`` from prometheus_client
_ENDPOINT_GAUGES: tuple[tuple[str, str, Callable[[EndpointRow], float | None]], ...] = (
    # absent while the scraped load is not fresh: unknown load is not idle
    ("router_endpoint_running_requests", "Requests running on the engine, as last scraped",
     lambda r: r.running if r.load_known else None),
    ("router_endpoint_waiting_requests", "Queue depth: requests waiting on the engine, as last scraped",
     lambda r: r.waiting if r.load_known else None),
    ("router_endpoint_kv_usage_ratio", "Engine KV-cache usage (0-1), as last scraped",
     lambda r: r.kv_usage if r.load_known else None),
    ("router_endpoint_load_known", "1 while the endpoint's scraped load is fresh", lambda r: int(r.load_known)),
    ("router_endpoint_queued_prefill_tokens", "Uncached prompt tokens the router estimates are queued there",
     lambda r: r.queued_prefill_tokens),
    ("router_endpoint_cache_occupancy_ratio", "Index entries held for the endpoint / its KV blocks",
     lambda r: r.occupancy),
    ("router_endpoint_cached_tokens_actual_to_predicted_ratio",
     "Engine-reported cached tokens / router-predicted cached tokens over the last 60 s",
     lambda r: r.prediction_ratio),
    ("router_endpoint_kv_stream_connected", "1 while the endpoint's KV-event stream is connected",
     lambda r: None if r.stream is None else int(r.stream.connected)),
    ("router_endpoint_kv_stream_precise", "1 while the router routes the endpoint by its KV events",
     lambda r: None if r.stream is None else int(r.stream.precise)),
    ("router_endpoint_kv_event_age_seconds", "Seconds since the endpoint's last applied KV-event batch",
     lambda r: None if r.stream is None else r.stream.event_age_s),
)  # fmt: skip
_ENDPOINT_COUNTERS: tuple[tuple[str, str, Callable[[EndpointRow], float | None]], ...] = (
    ("router_endpoint_routed_requests", "Requests the router sent there (as the pick)", lambda r: r.routed.requests),
    ("router_endpoint_routed_prompt_tokens", "Prompt tokens the router sent there",
     lambda r: r.routed.prompt_tokens),
    ("router_endpoint_predicted_cached_tokens", "Prompt tokens the router predicted cached there",
     lambda r: r.routed.predicted_cached_tokens),
    ("router_endpoint_engine_cached_tokens", "Prompt tokens the engine reports as prefix-cache hits",
     lambda r: r.engine_hit_tokens),
    ("router_endpoint_engine_queried_tokens", "Prompt tokens the engine looked up in its prefix cache",
     lambda r: r.engine_queried_tokens),
    ("router_endpoint_kv_blocks_stored", "Blocks its KV events stored (BlockStored, applied)",
     lambda r: None if r.stream is None else r.stream.blocks_stored),
    ("router_endpoint_kv_blocks_removed", "Blocks its KV events removed (BlockRemoved, applied)",
     lambda r: None if r.stream is None else r.stream.blocks_removed),
)  # fmt: skip
_MODEL_SERIES: tuple[tuple[str, str, bool, Callable[[ModelRow], float | None]], ...] = (
    ("router_model_routed_requests", "Requests routed, by model and tenant class", True, lambda r: r.routed.requests),
    ("router_model_routed_prompt_tokens", "Prompt tokens routed", True, lambda r: r.routed.prompt_tokens),
    ("router_model_predicted_cached_tokens", "Prompt tokens predicted cached on the pick", True,
     lambda r: r.routed.predicted_cached_tokens),
    ("router_model_predicted_hit_ratio", "Predicted cached / routed prompt tokens since start", False,
     lambda r: r.predicted_hit_ratio),
    ("router_model_ceiling_prompt_tokens", "Prompt tokens the ceiling estimate saw", True,
     lambda r: None if r.ceiling is None else r.ceiling.prompt_tokens),
    ("router_model_ceiling_hit_tokens", "Of those, tokens an infinite prefix cache would have hit", True,
     lambda r: None if r.ceiling is None else r.ceiling.hit_tokens),
    ("router_model_cached_share_ceiling_ratio", "Cached-share ceiling estimate: infinite-cache hit share", False,
     lambda r: None if r.ceiling is None else r.ceiling.share),
)  # fmt: skip


class FleetCollector(Collector):
    """Yields every fleet family from one ``view()`` per scrape (families with no rows still get their HELP)."""

    def __init__(self, view: Callable[[], FleetView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        v = self._view()
        for name, doc, value in _ENDPOINT_GAUGES:
            yield _family(GaugeMetricFamily(name, doc, labels=_EP), [([r.id], value(r)) for r in v.endpoints])
        for name, doc, value in _ENDPOINT_COUNTERS:
            yield _family(CounterMetricFamily(name, doc, labels=_EP), [([r.id], value(r)) for r in v.endpoints])
        yield from _phases(v)
        for name, doc, counter, mvalue in _MODEL_SERIES:
            rows = [([r.model, r.tenant_class], mvalue(r)) for r in v.models]
            if counter:
                yield _family(CounterMetricFamily(name, doc, labels=_MODEL), rows)
            else:
                yield _family(GaugeMetricFamily(name, doc, labels=_MODEL), rows)
        index = GaugeMetricFamily("router_index_blocks", "Distinct blocks in the in-memory index", labels=["index"])
        per = GaugeMetricFamily("router_endpoint_index_blocks", "The endpoint's entries in the in-memory index",
                                labels=["endpoint", "index"])  # fmt: skip
        for name, blocks in v.index_blocks.items():
            index.add_metric([name], blocks)
        for r in v.endpoints:
            for name, entries in r.index_entries.items():
                per.add_metric([r.id, name], entries)
        yield index
        yield per
        dropped = "Requests the ceiling estimate skipped (its queue was full)"
        yield CounterMetricFamily("router_ceiling_dropped_requests", dropped, value=v.ceiling_dropped)
        yield GaugeMetricFamily("router_ceiling_queued_requests", "Requests waiting for the ceiling estimate",
                                value=v.ceiling_queued)  # fmt: skip


def _family(family: _F, rows: list[tuple[list[str], float | None]]) -> Metric:
    for labels, value in rows:
        if value is not None:
            family.add_metric(labels, value)
    return family


def _phases(v: FleetView) -> Iterator[SummaryMetricFamily]:
    """The engine's request phase times (its histograms' sum and count): mean = rate(_sum) / rate(_count)."""
    for phase in PHASES:
        family = SummaryMetricFamily(f"router_endpoint_engine_{phase}_seconds",
                                     f"Engine-reported request {phase} time", labels=_EP)  # fmt: skip
        for r in v.endpoints:
            totals = r.phases.get(phase)
            if totals is not None:
                family.add_metric([r.id], count_value=int(totals.requests), sum_value=totals.seconds)
        yield family
