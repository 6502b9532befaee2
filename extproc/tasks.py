"""Stopping background tasks for certain.

``task.cancel(); await task`` is not enough on Python 3.11: ``asyncio.wait_for`` (used inside redis-py's
send path) returns its inner result and drops a cancellation that arrives just as the inner call finishes
(CPython gh-86296, fixed in 3.12). A keeper loop that makes Redis calls every tick then never sees its
cancel and runs on, and whoever awaits it waits forever (seen in CI: a lease keeper's ``close`` hung).
``stop_task`` cancels again until the task is done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

_RECANCEL_EVERY_S = 0.05


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it is done, cancelling it again every 50 ms while a cancellation was
    swallowed. An exception other than the cancellation is logged, not raised (the task is being stopped)."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_RECANCEL_EVERY_S)
    if not task.cancelled() and task.exception() is not None:
        log.warning("task %s ended with %r while being stopped", task.get_name(), task.exception())
