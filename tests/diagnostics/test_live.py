"""Prefix stability on the live path: the router calls the hook, the hook samples, the metrics export it,
the composition root wires it, and the status page's fragment shows it without prompt text."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import xml.etree.ElementTree as ET

import pytest
from prometheus_client import CollectorRegistry

from extproc.app import App
from extproc.config import DiagnosticsConfig
from extproc.diagnostics.live import PrefixStabilityCollector, SampledDiagnostics
from extproc.diagnostics.prefix_stability import MessageRef
from extproc.diagnostics.report import render_section, svg_plot, text_report
from extproc.types import RoutingRequest, Tenant
from tests.support.config import router_config
from tests.support.router_fakes import make_router, post

SYSTEM = list(range(1000, 1400))
STAMP_AT = 8


def _stamped(i: int) -> list[int]:
    """400 system tokens with a per-request 'timestamp' at tokens 8..15, then one of three questions."""
    return SYSTEM[:STAMP_AT] + [50000 + 10 * i + k for k in range(8)] + SYSTEM[STAMP_AT + 8 :] + [7000 + i % 3] * 40


def _routing(tokens: list[int], tenant: str = "gold") -> RoutingRequest:
    return RoutingRequest("r", "m", "m", None, len(tokens), [], 16, Tenant(tenant), token_ids=tokens)


def _live(fraction: float = 1.0, **config: object) -> SampledDiagnostics:
    cfg = DiagnosticsConfig(sample_fraction=fraction, **config)  # type: ignore[arg-type]
    return SampledDiagnostics(cfg, lambda t: t if t == "gold" else "default", rng=random.Random(3), key=5)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    return {
        (s.name, s.labels.get("model", ""), s.labels.get("tenant", "")): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith("router_prefix_")
    }


def _labelled(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.values()): s.value for f in registry.collect() for s in f.samples if s.name == name}


@pytest.mark.parametrize(
    ("fraction", "low", "high"), [(0.0, 0, 0), (1.0, 400, 400), (0.05, 8, 35)], ids=["off", "all", "five-percent"]
)
async def test_the_router_calls_the_hook_once_per_request_and_it_samples(fraction: float, low: int, high: int) -> None:
    live = _live(fraction)
    offered: list[RoutingRequest] = []
    router, _, _ = make_router(list(range(200)))

    def diagnose(routing: RoutingRequest) -> None:
        offered.append(routing)
        live.offer(routing)

    router._deps = dataclasses.replace(router._deps, diagnose=diagnose)
    for _ in range(400):
        await router.route(post())
    assert len(offered) == 400 and offered[0].token_ids == list(range(200))
    diagnosed = sum(r.diagnosed for r in live.detector.reports())
    assert low <= diagnosed <= high


def test_every_metric_is_exported_per_model_and_tenant_class() -> None:
    live = _live()
    registry = CollectorRegistry()
    registry.register(PrefixStabilityCollector(live.detector))
    for i in range(20):
        live.offer(_routing(_stamped(i)))
        live.offer(_routing(SYSTEM + [9] * 40, tenant="unconfigured-id"))  # stable: no span
    samples = _samples(registry)
    gold, default = ("m", "gold"), ("m", "default")
    assert samples[("router_prefix_diagnosed_requests_total", *gold)] == 20
    assert samples[("router_prefix_diagnosed_requests_total", *default)] == 20
    assert samples[("router_prefix_varying_span_requests_total", *gold)] == 19
    assert samples[("router_prefix_varying_span_requests_total", *default)] == 0
    assert samples[("router_prefix_diagnosed_blocks_total", *gold)] == 20 * 27
    assert samples[("router_prefix_lost_blocks_total", *gold)] >= 19 * 24
    assert samples[("router_prefix_lost_blocks_total", *default)] == 0
    assert samples[("router_prefix_lost_hit_share", *gold)] > 0.8
    assert samples[("router_prefix_lost_hit_share", *default)] == 0
    offsets = _labelled(registry, "router_prefix_varying_span_offset_tokens")
    assert offsets == {("m", "gold", "", ""): STAMP_AT}  # only while reported; no markers learnt: no message


def test_short_or_missing_prompts_are_not_diagnosed() -> None:
    live = _live()
    live.offer(dataclasses.replace(_routing([1] * 10)))
    live.offer(dataclasses.replace(_routing([]), token_ids=None))
    assert live.detector.reports() == []


async def test_the_composition_root_wires_the_hook_and_its_metrics() -> None:
    on = App(router_config(diagnostics={"sample_fraction": 1}))
    off = App(router_config(diagnostics={"sample_fraction": 0}))
    try:
        assert on.diagnostics is not None and on.router._deps.diagnose == on.diagnostics.offer
        on.diagnostics.offer(_routing(_stamped(0)))
        on.diagnostics.offer(_routing(_stamped(1)))
        assert not _samples(on.metrics.registry)  # diagnosed on the loop's next turn, after the pick is answered
        await asyncio.sleep(0)  # exported on the app's own registry
        assert _samples(on.metrics.registry)[("router_prefix_diagnosed_requests_total", "m", "default")] == 2
        assert off.diagnostics is None and off.router._deps.diagnose is None
        assert not _samples(off.metrics.registry)
        assert 'id="prefix-stability"' in on.status.page() and 'id="prefix-stability"' not in off.status.page()
    finally:
        await on.stop()
        await off.stop()


async def test_at_start_the_app_learns_each_models_message_marker() -> None:
    app = App(router_config(diagnostics={"sample_fraction": 1}))
    await app.start()  # the endpoints are not there: it waits out its first-scrape bound (2 s)
    try:
        assert app.diagnostics is not None
        tokens = [1, 151644, 8948, 5, 5, 151644, 872, 6]  # <|im_start|>system ... <|im_start|>user ...
        markers = app.diagnostics._markers["Qwen/Qwen3-0.6B"]
        assert markers.locate(tokens, 3) == MessageRef(0, "system")
        assert markers.locate(tokens, 7) == MessageRef(1, "user")
    finally:
        await app.stop()


def test_reports_carry_no_prompt_text_and_the_fragment_is_well_formed() -> None:
    live = _live()
    for i in range(20):
        live.offer(_routing(_stamped(i)))
    reports = live.detector.reports()
    html = render_section(reports)
    ET.fromstring(html)  # plain, well-formed HTML + inline SVG (no script)
    assert "<script" not in html and "varying span" in html and "token 8" in html
    ET.fromstring(svg_plot(reports))
    text = text_report(reports)
    assert "message" not in text.split("at token 8")[1].split(",")[0]  # the live path knows no messages
    assert "50000" not in text + html  # no token ids, let alone text
    assert "no requests diagnosed" in render_section([])
