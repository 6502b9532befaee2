"""``status.page.render``: the ``/status`` HTML from a ``FleetView`` (pure; the browser test is in
``tests/e2e/test_status_page_e2e.py``)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from extproc.backends.vllm_metrics import PhaseTotals
from extproc.kvcache.subscriber import StreamStatus
from extproc.status.page import DEFAULT_SECTIONS, render
from extproc.status.view import FleetView, gather
from extproc.types import EndpointId, Reason
from tests.support.fleet import A, B, Fleet, decide, make_fleet

SECTION_IDS = ["fleet", "endpoints", "hit-rates", "streams", "models", "decisions"]


def _busy_fleet() -> Fleet:
    f = make_fleet()
    f.scrape(A, running=2, waiting=1, kv_usage=0.4, num_gpu_blocks=100, prefill_time=PhaseTotals(1.0, 2))
    f.streams[A] = StreamStatus(connected=True, trusted=True, cold=False, last_seq=7, last_event_s=f.clock.now)
    decide(f.tap, A, 100, 48, estimates_s={A: 0.01, B: 0.2}, request_id="req-<1>")
    decide(f.tap, B, 100, 0, reason=Reason.LOAD, tenant="gold")
    return f


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.ids += [v or "" for k, v in attrs if k == "id"]


def _parse(html: str) -> _Tags:
    p = _Tags()
    p.feed(html)
    return p


def test_every_section_is_there_in_order() -> None:
    html = render(gather(_busy_fleet().sources))
    assert _parse(html).ids == SECTION_IDS
    assert html.startswith("<!doctype html>") and '<meta http-equiv="refresh" content="5">' in html


def test_the_story_of_the_run_is_on_the_page() -> None:
    html = render(gather(_busy_fleet().sources))
    for fact in (A, B, "cache 1", "load 1", "precise", "not followed", "gold", "TTFT est. s: 10.0.0.1:8000 0.01",
                 "48.0%", "40.0%"):  # fmt: skip
        assert fact in html, fact
    assert "req-&lt;1&gt;" in html and "req-<1>" not in html  # escaped


def test_no_script_no_external_request() -> None:
    html = render(gather(_busy_fleet().sources))
    tags = set(_parse(html).tags)
    assert not tags & {"script", "link", "img", "iframe", "object"}
    assert not re.search(r"(src|href)=|url\(|@import", html)
    assert "svg" in tags


def test_an_empty_fleet_renders() -> None:
    view = FleetView(0.0, (), (), (), {}, {}, 0, 0)
    html = render(view)
    assert "no decisions yet" in html and _parse(html).ids == SECTION_IDS


def test_a_section_plugs_in() -> None:
    """The prefix-stability report (a later section) is one more renderer in the list."""

    def stability(view: FleetView) -> str:
        return f'<section id="prefix-stability"><h2>Prefix stability</h2>{len(view.endpoints)}</section>'

    def hidden(view: FleetView) -> str:
        return ""

    html = render(gather(_busy_fleet().sources), [*DEFAULT_SECTIONS, stability, hidden])
    assert _parse(html).ids == [*SECTION_IDS, "prefix-stability"]


def test_endpoints_without_phase_histograms_say_so() -> None:
    html = render(gather(_busy_fleet().sources))
    row = re.search(rf"<tr><td class=l>{re.escape(EndpointId(B))}</td><td class=l>.*?</tr>", html)
    assert row and "n/a" in row.group(0)
