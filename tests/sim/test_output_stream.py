"""OutputStream: when the HTTP handler is woken, and what it gets."""

from __future__ import annotations

import asyncio

from vllm_sim.request import OutputStream


async def test_streaming_coalesces_tokens_pushed_between_reads() -> None:
    out = OutputStream(wake_every=1)
    out.push(1, None)
    out.push(2, None)
    assert await out.next_delta() == ([1, 2], None)
    out.push(3, "length")
    assert await out.next_delta() == ([3], "length")


async def test_interval_waits_for_n_tokens_after_the_first() -> None:
    out = OutputStream(wake_every=3)
    out.push(1, None)
    assert await out.next_delta() == ([1], None)
    out.push(2, None)
    out.push(3, None)
    reader = asyncio.create_task(out.next_delta())
    await asyncio.sleep(0)
    assert not reader.done()
    out.push(4, None)
    assert await reader == ([2, 3, 4], None)


async def test_non_streaming_wakes_only_at_the_end() -> None:
    out = OutputStream(wake_every=0)
    reader = asyncio.create_task(out.next_delta())
    for t in range(5):
        out.push(t, None)
        await asyncio.sleep(0)
    assert not reader.done()
    out.push(5, "stop")
    assert await reader == ([0, 1, 2, 3, 4, 5], "stop")
