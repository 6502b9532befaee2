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
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

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


T = TypeVar("T")


async def within_or_orphan(coro: Coroutine[Any, Any, T], timeout_s: float, orphans: set[asyncio.Task[Any]]) -> T:
    """``coro``'s result if it comes within ``timeout_s``; else raise TimeoutError and let it run on, held in
    ``orphans`` until it ends (its result or error dropped, quietly).

    Why not ``asyncio.timeout``: a Redis call cancelled mid-read makes redis-py throw its pooled connection away
    (``read_response`` disconnects on any ``BaseException``), and the next call pays a new connection (TCP
    connect, HELLO, CLIENT SETINFO): three round trips where one was due, so one missed deadline makes the next
    one likelier (docs/scheduling.md, "Replicas as one"). A call left to finish keeps its connection;
    the client's own socket timeout still bounds it."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if done:
        return task.result()
    orphans.add(task)
    task.add_done_callback(_forget(orphans))
    raise TimeoutError(f"no answer within {timeout_s}s")


def _forget(orphans: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        orphans.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("a call past its deadline ended with %r", task.exception())

    return done
