"""The live path's message locator: a template's message marker, learnt from a probe through the real preparer."""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from extproc.config import DiagnosticsConfig
from extproc.diagnostics.live import SampledDiagnostics
from extproc.diagnostics.messages import MessageMarkers
from extproc.diagnostics.prefix_stability import MessageRef
from extproc.prompt.preparer import RequestPreparer, build_preparer
from extproc.types import HttpRequest, RoutingRequest, Tenant
from tests.support.config import router_config

M, S, U, A = 9, 1, 2, 3  # marker, then the role tokens system / user / assistant
CHATML_PROBE = [M, S, 50, 0, M, U, 51, 0, M, A, 52, 0, M, U, 53, 0]


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        (CHATML_PROBE, MessageMarkers(M, {S: "system", U: "user", A: "assistant"})),
        ([7, *CHATML_PROBE], MessageMarkers(M, {S: "system", U: "user", A: "assistant"})),  # a BOS first
        ([M, 60, 50, M, 60, 51, M, 60, 52, M, 60, 53], MessageMarkers(M, {})),  # roles not one token each
        ([5, 50, 6, 51, 5, 52, 6, 53], None),  # [INST]-style: no token opens every message
    ],
    ids=["chatml", "bos-first", "roles-unknown", "no-marker"],
)
def test_the_marker_is_the_first_token_opening_every_probe_message(
    probe: list[int], expected: MessageMarkers | None
) -> None:
    assert MessageMarkers.from_probe(probe) == expected


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (0, MessageRef(0, "system")),
        (3, MessageRef(0, "system")),
        (4, MessageRef(1, "user")),
        (10, MessageRef(2, "assistant")),
    ],
    ids=["first-token", "end-of-first", "second-opens", "third"],
)
def test_an_offset_falls_in_the_message_whose_marker_precedes_it(offset: int, expected: MessageRef) -> None:
    markers = MessageMarkers.from_probe(CHATML_PROBE)
    assert markers is not None and markers.locate(CHATML_PROBE, offset) == expected


async def test_a_live_span_names_its_message_through_the_real_preparer() -> None:
    """Qwen3's template, the picker's own preparer: the probe finds ``<|im_start|>``, and a timestamp at the
    top of the system prompt is reported in message 0 (system)."""
    config = router_config()
    model = config.models[0].name
    with ThreadPoolExecutor(1) as executor:
        await _live_span_in_message_0(build_preparer(config, Path.cwd(), executor), model)


async def _live_span_in_message_0(preparer: RequestPreparer, model: str) -> None:
    live = SampledDiagnostics(DiagnosticsConfig(sample_fraction=1), lambda t: "default", key=1)
    await live.probe_markers(preparer, [model, "not/a-model"])  # an unknown model is logged, not raised
    rng = random.Random(0)
    system = "You are a support assistant. Answer briefly and cite the documentation you used. " * 8
    for i in range(8):
        stamp = f"Now: 2026-12-02T{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z. "
        messages = [{"role": "system", "content": stamp + system}, {"role": "user", "content": f"question {i}"}]
        body = json.dumps({"model": model, "messages": messages}).encode()
        prepared = await preparer.prepare(HttpRequest("POST", "/v1/chat/completions", {}, body, f"r{i}"))
        tokens = prepared.token_ids
        assert tokens
        live.offer(RoutingRequest(f"r{i}", model, model, None, len(tokens), [], 16, Tenant(""), token_ids=tokens))
    (report,) = live.detector.reports()
    assert report.span is not None and report.span.message == MessageRef(0, "system")
