"""Through real Envoy, the picker and simulated vLLM backends: the routing path end to end.

What the clients see is what counts: the backend's own ``usage.prompt_tokens_details.cached_tokens``, the
status codes, and Envoy's access log (which backend served, how many attempts, the picker's reason).
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from bench.stack_config import MODEL
from tests.support.chat import cached, chat
from tests.support.golden import golden_case
from tests.support.stacks import StackFactory

pytestmark = [pytest.mark.envoy, pytest.mark.slow]


async def test_document_questions_follow_the_cache_and_the_leading_space_is_cold(make_stack: StackFactory) -> None:
    stack = make_stack(2)
    summary, conclusion, spaced = (golden_case(n) for n in ("doc_summary", "doc_conclusion", "doc_leading_space"))
    url = stack.envoy.url("/v1/chat/completions")
    async with aiohttp.ClientSession() as session:
        s1, first = await chat(session, url, summary["messages"])
        s2, second = await chat(session, url, conclusion["messages"])
        s3, third = await chat(session, url, spaced["messages"])
    assert (s1, s2, s3) == (200, 200, 200)
    log = stack.envoy.wait_for_access_log(3)
    assert log[1].upstream == log[0].upstream, "the second question must land on the first's backend"
    assert cached(first) == 0
    doc_tokens = len(conclusion["token_ids"])
    assert cached(second) >= doc_tokens - 2 * 16 - 16, "the backend must report the whole document cached"
    # One leading space changes every block after the system prompt: at most that one block is shared.
    assert cached(third) <= 16
    assert [e.reason for e in log] == ["load", "cache", "load"]


async def test_sse_streams_through_unbuffered(make_stack: StackFactory) -> None:
    stack = make_stack(1, sim_args=["--sim-decode-step-s", "0.02"])
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count slowly."}],
        "max_tokens": 20,
        "stream": True,
        "ignore_eos": True,
    }
    arrivals: list[float] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(stack.envoy.url("/v1/chat/completions"), json=body) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        async for line in resp.content:
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic())
    assert len(arrivals) >= 20
    assert arrivals[-1] - arrivals[0] > 0.2, "chunks must arrive as generated, not all at once at the end"


async def test_ten_mib_body_is_accepted(make_stack: StackFactory) -> None:
    stack = make_stack(1)
    prompt = [1000 + i % 50000 for i in range(1_600_000)]  # >10 MiB of JSON token ids: past every 1/4 MiB default
    payload = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()
    assert len(payload) > 10 * 1024 * 1024
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            stack.envoy.url("/v1/completions"), data=payload, headers={"content-type": "application/json"}
        ) as resp,
    ):
        status, text = resp.status, await resp.text()
    # Envoy and the picker accept it; the backend itself refuses a prompt past its max model length.
    assert status == 400, text
    assert "error" in json.loads(text) and "Token id" not in text
    entry = stack.envoy.wait_for_access_log(1)[0]
    assert entry.upstream in stack.backends


async def test_picker_down_requests_still_succeed(make_stack: StackFactory) -> None:
    stack = make_stack(2)
    assert stack.picker is not None
    stack.picker.stop()
    messages = [{"role": "user", "content": "Hello there"}]
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(chat(session, stack.envoy.url("/v1/chat/completions"), messages) for _ in range(6))
        )
    assert [s for s, _ in results] == [200] * 6
    hosts = {e.upstream for e in stack.envoy.wait_for_access_log(6)}
    assert hosts == set(stack.backends), "fail-open spreads round robin across the backends"


async def test_dead_pick_is_retried_on_the_fallback(make_stack: StackFactory) -> None:
    stack = make_stack(2, dead=1)
    async with aiohttp.ClientSession() as session:
        statuses = []
        for i in range(9):
            status, _ = await chat(
                session, stack.envoy.url("/v1/chat/completions"), [{"role": "user", "content": f"Question {i} " * 50}]
            )
            statuses.append(status)
    assert statuses == [200] * 9
    log = stack.envoy.wait_for_access_log(9)
    retried = [e for e in log if e.dest and e.dest.split(",")[0] in stack.dead]
    assert len(retried) == 9, "the picker prefers the (apparently idle) dead endpoint every time"
    assert all(e.attempts == 2 and e.upstream in stack.backends for e in retried)
