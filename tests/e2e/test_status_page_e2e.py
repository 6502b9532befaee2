"""``/status`` in a real headless browser (Debian's ``chromium``), on a real stack: Envoy, the picker and two
simulated vLLM backends publishing KV events.

After a few requests (a document twice, so the second is a cache hit, and a tenant of its own) the page must
show every part: the fleet summary, both endpoints with load and KV use, predicted against actual hit rates,
the event streams, models and tenant classes, and the recent decisions with their reasons. ``--dump-dom``
checks the text; ``--screenshot`` checks that the SVG bars were drawn (their colours are in the picture).
Skips, saying why, when chromium is not installed (``scripts/setup.sh`` installs it where it can).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from bench.stack import Stack
from extproc import wire
from tests.support.chat import chat
from tests.support.golden import golden_case
from tests.support.polling import until
from tests.support.stacks import StackFactory

pytestmark = [pytest.mark.envoy, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SECTIONS = ('id="fleet"', 'id="endpoints"', 'id="hit-rates"', 'id="streams"', 'id="models"', 'id="decisions"')
# extproc/status/svg.py: the first two series colours and the bars' track
BAR_COLOURS = {"blue bars": (0x3B, 0x73, 0xB9), "orange bars": (0xE0, 0x8A, 0x1E), "bar tracks": (0xEE, 0xEE, 0xEE)}
MIN_PIXELS = 200


def _status_url(stack: Stack) -> str:
    return stack.picker_metrics_url.rsplit("/", 1)[0] + "/status"


def _browser(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", f"--user-data-dir={tmp / 'profile'}", *args]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return str(resp.read().decode())


def _colours_drawn(png: Path) -> set[str]:
    """The bar colours that cover at least ``MIN_PIXELS`` of the screenshot."""
    from PIL import Image  # matplotlib's dependency (the bench extra)

    with Image.open(png) as image:
        counts = {rgb: n for n, rgb in image.convert("RGB").getcolors(maxcolors=1 << 24) or ()}
    return {name for name, rgb in BAR_COLOURS.items() if counts.get(rgb, 0) >= MIN_PIXELS}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; scripts/setup.sh)")
async def test_the_status_page_tells_the_story_in_a_browser(make_stack: StackFactory, tmp_path: Path) -> None:
    stack = make_stack(2, kv_events=True, picker={"tenants": {"classes": {"gold": {"priority": 1}}}})
    url = stack.envoy.url("/v1/chat/completions")
    doc = golden_case("doc_summary")["messages"]
    status_url = _status_url(stack)
    gold = [{"role": "user", "content": "Hello there."}]
    async with aiohttp.ClientSession() as session:
        for i, (messages, headers) in enumerate(((doc, {}), (doc, {}), (gold, {wire.TENANT_HEADER: "gold"}))):
            status, _ = await chat(session, url, messages, headers=headers)
            assert status == 200
            await asyncio.sleep(0.3)  # the engine's KV events and a scrape land between requests
            if i == 0:  # a first view: the windowed rates and ratios start from it
                await asyncio.to_thread(_fetch, status_url)
    await until(lambda: "cache 1" in _fetch(status_url), 10.0, "the cache hit on the page", in_thread=True)

    dom = _browser(tmp_path, "--dump-dom", status_url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for part in (*SECTIONS, *stack.endpoints, "What the scheduler sees", "Decisions by reason", "cache 1",
                 "precise", "connected", "gold", "Hit rates: predicted vs actual", "Recent decisions", "<svg"):  # fmt: skip
        assert part in html, part
    assert html.count("<svg") >= 6  # bars per endpoint and per model, and the reasons

    png = tmp_path / "status.png"
    shot = _browser(tmp_path, f"--screenshot={png}", "--window-size=1500,1800", "--hide-scrollbars", status_url)
    assert shot.returncode == 0 and png.exists(), shot.stderr[-2000:]
    assert _colours_drawn(png) == set(BAR_COLOURS), "every kind of bar drawn in the screenshot"
