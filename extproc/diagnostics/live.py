"""Prefix stability on the live path: the router's sampled hook, and the metrics exported at scrape time.

The router calls ``SampledDiagnostics.offer(routing)`` once per routed request (in ``Router._observe``); a
sampled request costs one fingerprinting pass and a few vectorised comparisons on the event loop (~0.1-1 ms
for 10k tokens), an unsampled one a random draw. Only fingerprints are kept: never prompt text.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from extproc.config import DiagnosticsConfig
from extproc.diagnostics.fingerprints import Fingerprinter
from extproc.diagnostics.prefix_stability import PrefixStability, StabilitySettings, StreamKey
from extproc.types import RoutingRequest

log = logging.getLogger(__name__)

GRANULE_TOKENS = 4  # fingerprint granularity: span offsets are this precise; 8 stored bytes per 4 tokens


def settings_from_config(config: DiagnosticsConfig) -> StabilitySettings:
    """The detector's settings from the validated config (the one home of their defaults)."""
    return StabilitySettings(
        recent_requests=config.recent_requests, memory_bytes=config.memory_mib << 20,
        max_span_tokens=config.max_span_tokens, max_shift_tokens=config.max_shift_tokens,
        window_requests=config.window_requests, min_share=config.min_share, min_findings=config.min_findings,
        plot_blocks=config.plot_blocks,
    )  # fmt: skip


class SampledDiagnostics:
    """The router's hook: diagnoses a ``sample_fraction`` of routed requests, per (base model, tenant class)."""

    def __init__(
        self,
        config: DiagnosticsConfig,
        tenant_class: Callable[[str], str],
        *,
        rng: random.Random | None = None,
        key: int | None = None,
    ) -> None:
        """``tenant_class`` maps a tenant id to a bounded label (configured classes, else "default");
        ``key`` seeds the fingerprints (default: random per process)."""
        self.detector = PrefixStability(settings_from_config(config))
        self._fraction = config.sample_fraction
        self._max_tokens = config.max_prompt_tokens
        self._tenant_class = tenant_class
        self._rng = rng or random.Random()
        self._fingerprinter = Fingerprinter(GRANULE_TOKENS, self._rng.getrandbits(64) if key is None else key)

    def offer(self, routing: RoutingRequest) -> None:
        """When: once per routed request, after the decision. Never raises for odd input."""
        if self._fraction <= 0 or self._rng.random() >= self._fraction:
            return
        tokens = routing.token_ids
        if not tokens or len(tokens) < routing.block_size:
            return
        try:
            view = self._fingerprinter.view(tokens[: self._max_tokens])
            key = StreamKey(routing.base_model, self._tenant_class(routing.tenant.id))
            self.detector.observe(key, view, routing.block_size)
        except Exception:  # a diagnostic must never fail a request it only watches
            log.warning("prefix-stability diagnosis failed (request %s)", routing.request_id, exc_info=True)


class PrefixStabilityCollector(Collector):
    """``router_prefix_*`` per model and tenant class, read from the detector at scrape time (see
    docs/diagnostics.md for each, and what to do when it looks wrong)."""

    def __init__(self, detector: PrefixStability) -> None:
        self._detector = detector

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["model", "tenant"]
        diagnosed = CounterMetricFamily(
            "router_prefix_diagnosed_requests", "Requests sampled for prefix-stability diagnosis", labels=labels
        )
        varying = CounterMetricFamily(
            "router_prefix_varying_span_requests",
            "Diagnosed requests whose prefix broke at a short varying span while later content repeated",
            labels=labels,
        )
        blocks = CounterMetricFamily(
            "router_prefix_diagnosed_blocks", "Full prompt blocks of the diagnosed requests", labels=labels
        )
        lost = CounterMetricFamily(
            "router_prefix_lost_blocks",
            "Of those, blocks after a varying span that would have been cache hits were the span stable",
            labels=labels,
        )
        share = GaugeMetricFamily(
            "router_prefix_lost_hit_share",
            "Recent window: share of prompt blocks lost to a varying span (0..1)",
            labels=labels,
        )
        offset = GaugeMetricFamily(
            "router_prefix_varying_span_offset_tokens",
            "Token offset of the typical varying span; present only while one is reported",
            labels=labels,
        )
        for r in self._detector.reports():
            values = list(r.key)
            diagnosed.add_metric(values, r.diagnosed)
            varying.add_metric(values, r.varying)
            blocks.add_metric(values, r.prompt_blocks)
            lost.add_metric(values, r.lost_blocks)
            share.add_metric(values, r.lost_share)
            if r.span is not None:
                offset.add_metric(values, r.span.offset_tokens)
        yield from (diagnosed, varying, blocks, lost, share, offset)
