"""The picker killed, restarted, or slow past Envoy's message timeout, under load, through real Envoy.

What the clients see: every request gets an answer (200: Envoy's override_host round robin serves while the
picker cannot), none hangs (each finishes within the message timeout plus a margin), and picks resume once
the picker is back, without touching Envoy.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from bench.stack import Stack
from bench.stack_config import MODEL
from tests.faults.load import Load, one, running, summary
from tests.support.stacks import StackFactory

pytestmark = [pytest.mark.envoy, pytest.mark.slow]
MESSAGE_TIMEOUT_S = 2.0  # EnvoyOptions.message_timeout_s's default, what the stack's Envoy runs with


async def picks_resume(stack: Stack, seen: int, timeout_s: float = 10.0) -> None:
    """Sequential requests until one carries the picker's decision again (its reason header)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "Are you back?"}], "max_tokens": 1}
            out = await one(session, stack.envoy.url("/v1/chat/completions"), body)
            assert out.status == 200, out
            seen += 1
            if stack.envoy.wait_for_access_log(seen)[-1].reason:
                return
            assert time.monotonic() < deadline, "the picker's decisions did not come back"


def assert_all_answered(outcomes: list, bound_s: float) -> None:  # type: ignore[type-arg]
    assert outcomes, "no load ran"
    bad = [o for o in outcomes if o.error is not None or o.status != 200]
    assert not bad, summary(outcomes)
    assert max(o.seconds for o in outcomes) < bound_s, summary(outcomes)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
async def test_picker_killed_and_restarted_under_load(make_stack: StackFactory, sig: signal.Signals) -> None:
    stack = make_stack(2)
    assert stack.picker is not None and stack.picker.pid is not None
    async with running(Load(stack.envoy.url("/v1/chat/completions"), workers=4)) as load:
        await asyncio.sleep(1.0)
        os.killpg(stack.picker.pid, sig)  # our own child's process group
        await asyncio.to_thread(stack.picker._proc.wait, 10)  # type: ignore[union-attr]
        await asyncio.sleep(1.5)  # outage: fail-open serves
        during = len(load.outcomes)
        await asyncio.to_thread(stack.restart_picker, 0, "restarted")  # same ports: Envoy points there
        await asyncio.sleep(1.5)
    outcomes = load.outcomes
    assert len(outcomes) > during > 0
    assert_all_answered(outcomes, bound_s=MESSAGE_TIMEOUT_S + 3.0)
    log = stack.envoy.wait_for_access_log(len(outcomes))
    assert any(not e.reason for e in log), "some requests were served without a pick (the outage)"
    assert all(e.upstream in stack.backends for e in log)
    await picks_resume(stack, len(log))


async def test_picker_slow_past_the_message_timeout_under_load(make_stack: StackFactory) -> None:
    stack = make_stack(2)
    assert stack.picker is not None and stack.picker.pid is not None
    async with running(Load(stack.envoy.url("/v1/chat/completions"), workers=4)) as load:
        await asyncio.sleep(1.0)
        os.killpg(stack.picker.pid, signal.SIGSTOP)  # frozen: connections stay open, nothing is answered
        try:
            await asyncio.sleep(MESSAGE_TIMEOUT_S + 2.0)
        finally:
            os.killpg(stack.picker.pid, signal.SIGCONT)
        await asyncio.sleep(1.5)
    outcomes = load.outcomes
    assert_all_answered(outcomes, bound_s=MESSAGE_TIMEOUT_S + 3.0)
    assert any(o.seconds >= MESSAGE_TIMEOUT_S * 0.9 for o in outcomes), "some requests waited out the timeout"
    log = stack.envoy.wait_for_access_log(len(outcomes))
    assert any(not e.reason for e in log) and all(e.upstream in stack.backends for e in log)
    await picks_resume(stack, len(log))
