"""Precise mode end to end: simulators publish vLLM KV events, the picker follows them, Envoy routes.

The backends' own ``cached_tokens`` are the ground truth: after an engine restart the picker must never send a
request to the cache the engine no longer has.
"""

from __future__ import annotations

import time
import urllib.request

import aiohttp
import pytest

from tests.support.chat import cached, chat
from tests.support.golden import golden_case
from tests.support.stacks import StackFactory

pytestmark = [pytest.mark.envoy, pytest.mark.slow]


def picker_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=2) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_events_route_precisely_and_a_restart_purges_the_phantom_cache(make_stack: StackFactory) -> None:
    stack = make_stack(2, kv_events=True)
    summary, conclusion = golden_case("doc_summary"), golden_case("doc_conclusion")
    url = stack.envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        _, first = await chat(session, url, summary["messages"])
        time.sleep(1.0)  # let the BlockStored events arrive (slack for a busy CI box)
        _, second = await chat(session, url, conclusion["messages"])
        log = stack.envoy.wait_for_access_log(2)
        warm = log[0].upstream
        assert log[1].upstream == warm and log[1].reason == "cache"
        assert picker_metric(stack.picker_metrics_url, "router_precise_endpoints") == 2
        assert picker_metric(stack.picker_metrics_url, "router_kv_ingest_blocks_stored_total") >= 39
        assert cached(second) >= len(conclusion["token_ids"]) - 48

        stack.restart_backend(warm)  # empty cache, sequence back to 0, no AllBlocksCleared
        time.sleep(1.0)  # the purge must land within 1 s
        _, third = await chat(session, url, conclusion["messages"])
    log = stack.envoy.wait_for_access_log(3)
    assert log[2].reason == "load", "the restarted engine's old cache must not attract the request"
    assert cached(third) == 0
    assert picker_metric(stack.picker_metrics_url, "router_kv_ingest_purges_total") >= 3  # 2 at start + restart
