"""Waiting in tests: ``until(cond)`` polls, bounded, and returns the seconds it took or fails saying what."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.01


async def until(
    cond: Callable[[], object], timeout_s: float = 15.0, what: str = "condition", *,
    poll_s: float = POLL_S, in_thread: bool = False,
) -> float:  # fmt: skip
    """Await until ``cond()`` is truthy; returns the seconds waited. Raises ``AssertionError`` naming ``what``
    after ``timeout_s``. ``in_thread``: ``cond`` blocks (e.g. an HTTP scrape), so it runs in a worker thread."""
    start = time.monotonic()
    while not (await asyncio.to_thread(cond) if in_thread else cond()):
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(poll_s)
    return time.monotonic() - start
