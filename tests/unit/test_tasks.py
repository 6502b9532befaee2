"""stop_task: a task that swallows its cancellation (as Python 3.11's wait_for can) is still stopped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from extproc.tasks import stop_task


async def test_a_task_that_swallows_cancellations_is_cancelled_again_until_it_ends() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed < 3:  # what a racing wait_for does: the cancel is lost
                    swallowed += 1
                    continue
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_task(task), 5)
    assert task.cancelled() and swallowed == 3


async def test_done_and_missing_tasks_and_failures_are_fine(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails(), name="failing")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="extproc.tasks"):
        await stop_task(task)  # logged, not raised
    assert task.done() and isinstance(task.exception(), RuntimeError)
    assert "failing ended with RuntimeError('boom')" in caplog.text
    await stop_task(None)
