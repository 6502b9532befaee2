"""Prefix stability on the live path: the router's sampled hook, and the metrics exported at scrape time.

The router calls ``SampledDiagnostics.offer(routing)`` once per routed request (in ``Router._observe``); a
sampled request costs one fingerprinting pass and a few vectorised comparisons on the event loop (~0.3-1 ms
for 10k tokens), an unsampled one a random draw. Only fingerprints are kept: never prompt text. A span names
its chat message where ``probe_markers`` found the model's message marker at start (``messages``).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from extproc.config import DiagnosticsConfig
from extproc.diagnostics.fingerprints import Fingerprinter
from extproc.diagnostics.messages import PROBE_MESSAGES, MessageMarkers
from extproc.diagnostics.prefix_stability import PrefixStability, StabilitySettings, StreamKey
from extproc.types import HttpRequest, PreparedPrompt, RoutingRequest

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


class Preparing(Protocol):
    """The part of the router's ``Preparer`` the probe uses."""

    async def prepare(self, request: HttpRequest, tokenize_within_s: float | None = None) -> PreparedPrompt: ...


class SampledDiagnostics:
    """The router's hook: diagnoses a ``sample_fraction`` of routed requests, per (base model, tenant class)."""

    def __init__(
        self,
        config: DiagnosticsConfig,
        tenant_class: Callable[[str], str],
        *,
        rng: random.Random | None = None,
        key: int | None = None,
        defer: Callable[[Callable[[], None]], object] | None = None,
    ) -> None:
        """``tenant_class`` maps a tenant id to a bounded label (configured classes, else "default");
        ``key`` seeds the fingerprints (default: random per process); ``defer`` runs a diagnosis (default:
        at once)."""
        self.detector = PrefixStability(settings_from_config(config))
        self._fraction = config.sample_fraction
        self._max_tokens = config.max_prompt_tokens
        self._tenant_class = tenant_class
        self._rng = rng or random.Random()
        self._fingerprinter = Fingerprinter(GRANULE_TOKENS, self._rng.getrandbits(64) if key is None else key)
        self._markers: dict[str, MessageMarkers] = {}  # base model -> its template's message markers
        self._defer = defer or (lambda work: work())

    async def probe_markers(self, preparer: Preparing, models: Iterable[str]) -> None:
        """When: at start, after the tokenizers are warm. Renders ``messages.PROBE_MESSAGES`` per model through
        the picker's own preparer, so that later findings name their chat message; never raises."""
        for model in models:
            body = json.dumps({"model": model, "messages": PROBE_MESSAGES, "add_generation_prompt": False})
            probe = HttpRequest("POST", "/v1/chat/completions", {"content-type": "application/json"},
                                body.encode(), "diagnostics-probe")  # fmt: skip
            try:
                tokens = (await preparer.prepare(probe)).token_ids
            except Exception as exc:  # RouterError (an unknown model) or anything else: start must go on
                tokens, why = None, str(exc)
            else:
                why = "its chat template opens messages with no common token"
            if not tokens or not self.learn_markers(model, tokens):
                log.info("diagnostics: varying spans of %s name no message (%s)", model, why)

    def learn_markers(self, model: str, probe_tokens: Sequence[int]) -> bool:
        """When: at start, per base model, with ``messages.PROBE_MESSAGES`` rendered and tokenized by the
        picker's preparer. Later findings of that model name their message. False: no marker found."""
        markers = MessageMarkers.from_probe(probe_tokens)
        if markers is not None:
            self._markers = {**self._markers, model: markers}  # swapped whole: the hot path reads it unlocked
        return markers is not None

    def offer(self, routing: RoutingRequest) -> None:
        """When: once per routed request, after the decision. A sampled request is diagnosed by ``defer``
        (the app: the event loop's next turn, so the pick is answered first). Never raises."""
        if self._fraction <= 0 or self._rng.random() >= self._fraction:
            return
        if routing.token_ids and len(routing.token_ids) >= routing.block_size:
            self._defer(partial(self._diagnose, routing))

    def _diagnose(self, routing: RoutingRequest) -> None:
        tokens = routing.token_ids or ()
        try:
            view = self._fingerprinter.view(tokens[: self._max_tokens])
            key = StreamKey(routing.base_model, self._tenant_class(routing.tenant.id))
            markers = self._markers.get(routing.base_model)
            locate = partial(markers.locate, tokens) if markers else None
            self.detector.observe(key, view, routing.block_size, locate)
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
            "Token offset of the typical varying span, and its chat message (index, role; '' unknown); present "
            "only while one is reported",
            labels=[*labels, "message", "role"],
        )
        for r in self._detector.reports():
            values = list(r.key)
            diagnosed.add_metric(values, r.diagnosed)
            varying.add_metric(values, r.varying)
            blocks.add_metric(values, r.prompt_blocks)
            lost.add_metric(values, r.lost_blocks)
            share.add_metric(values, r.lost_share)
            if r.span is not None:
                m = r.span.message
                offset.add_metric([*values, str(m.index) if m else "", m.role if m else ""], r.span.offset_tokens)
        yield from (diagnosed, varying, blocks, lost, share, offset)
