"""Front workers (``workers.fronts: 2``) through real Envoy and simulated backends: the same decisions as one
process, one ``/metrics``, a front that dies is replaced, and stopping the picker leaves no front behind.

The picker discovers the hash scheme from the backends (``make_stack``): the fronts start on vLLM's defaults
and the decider corrects them (``SchemeChanged``) if the engines report otherwise.
"""

from __future__ import annotations

import os
import re
import signal
import urllib.request

import aiohttp
import pytest

from bench.procs import children_of
from tests.support import polling
from tests.support.chat import cached, chat
from tests.support.golden import golden_case
from tests.support.stacks import StackFactory

pytestmark = [pytest.mark.envoy, pytest.mark.slow]

FRONTS = {"workers": {"fronts": 2}}


def metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5.0) as resp:
        return str(resp.read().decode())


def total(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_fronts_route_by_cache_like_one_process_and_share_one_metrics_page(make_stack: StackFactory) -> None:
    stack = make_stack(2, picker=FRONTS)
    picker_pid = stack.picker_pids()[0]
    fronts = children_of(picker_pid)
    assert len(fronts) == 2, f"two front processes under the picker, got {fronts}"
    summary, conclusion = golden_case("doc_summary"), golden_case("doc_conclusion")
    url = stack.envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        statuses, bodies = [], []
        for case in (summary, conclusion, conclusion, summary):
            status, body = await chat(session, url, case["messages"])
            statuses.append(status)
            bodies.append(body)
    assert statuses == [200] * 4
    log = stack.envoy.wait_for_access_log(4)
    assert [e.reason for e in log] == ["load", "cache", "cache", "cache"]
    assert len({e.upstream for e in log}) == 1, "every question follows the document to its backend"
    assert cached(bodies[1]) >= len(conclusion["token_ids"]) - 3 * 16
    pages: list[str] = []

    def fronts_reported() -> bool:
        pages[:] = [metrics(stack.picker_metrics_urls[0])]
        return total(pages[0], "router_tokenizer_encoder") > 0

    await polling.until(fronts_reported, 10.0, "the fronts' tokenizer metrics on the picker's /metrics", in_thread=True)
    page = pages[0]
    assert total(page, "router_decisions_total") == 4, "the decider counts every decision once"
    assert total(page, "router_tokenizer_encoder") == 1, "one encoder per model, not one per front"
    assert total(page, "router_decider_unavailable_total") == 0


async def test_a_front_that_dies_is_replaced_and_stopping_leaves_no_front(make_stack: StackFactory) -> None:
    stack = make_stack(2, picker=FRONTS)
    picker_pid = stack.picker_pids()[0]
    first, second = children_of(picker_pid)
    os.kill(first, signal.SIGKILL)

    def replacements() -> list[int]:
        return [p for p in children_of(picker_pid) if p not in (first, second)]

    await polling.until(replacements, 30.0, "a replacement front", in_thread=True)
    replaced = replacements()
    summary = golden_case("doc_summary")
    url = stack.envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        for _ in range(6):  # whichever front Envoy reaches, each request is answered
            status, _ = await chat(session, url, summary["messages"])
            assert status == 200
    stack.stop()
    assert not [p for p in (second, *replaced) if alive(p)], "fronts must stop with the picker"
