"""The decider's side of the local socket: asks from every front answered by the one ``LocalDecider``.

Each ask runs as its own task (a Redis-backed lookup may wait on I/O; other asks must not queue behind it), and
each reply is written as one frame on the connection the ask came from. ``stats`` frames feed
``MergedMetrics``; ``ready`` frames are passed to ``on_ready`` so start-up can wait for every front.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from extproc.decider import Ask, Decider, SchemeChanged
from extproc.errors import RouterError
from extproc.tasks import stop_task
from extproc.types import Route
from extproc.workers import frames
from extproc.workers.metrics import MergedMetrics

log = logging.getLogger(__name__)


class DeciderServer:
    """Serves ``decider`` on a Unix socket (``start(path)``) until ``stop()``."""

    def __init__(self, decider: Decider, metrics: MergedMetrics, on_ready: Callable[[int], None]) -> None:
        self._decider = decider
        self._metrics = metrics
        self._on_ready = on_ready
        self._server: asyncio.AbstractServer | None = None
        self._streams: set[frames.FrameStream] = set()
        self._asks: set[asyncio.Task[None]] = set()

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._connection, path=path)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for stream in list(self._streams):
            stream.close()
        for task in list(self._asks):
            await stop_task(task)

    def _connection(self) -> frames.FrameStream:
        front: list[int] = []  # the front's index, once it said (stats, ready)

        def on_frame(frame: frames.Frame) -> None:
            kind = frame[0]
            if kind == "ask":
                self._spawn(self._answer(frame[1], frame[2], stream))
            elif kind == "served":
                self._decider.on_served(frame[1], frame[2])
            elif kind == "stats":
                front[:] = [frame[1]]
                self._metrics.update(frame[1], frame[2])
            elif kind == "ready":
                front[:] = [frame[1]]
                self._on_ready(frame[1])

        def on_closed() -> None:
            self._streams.discard(stream)
            for index in front:
                self._metrics.forget(index)

        stream = frames.FrameStream(on_frame, on_closed)
        self._streams.add(stream)
        return stream

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._asks.add(task)
        task.add_done_callback(self._asks.discard)

    async def _answer(self, seq: int, ask: Ask, stream: frames.FrameStream) -> None:
        try:
            route = await self._decider.decide(ask)
            if isinstance(route, Route):
                reply: frames.Frame = ("route", seq, route.endpoints, dict(route.headers))
            else:
                reply = ("pass", seq)
        except RouterError as exc:
            reply = ("refused", seq, type(exc).__name__, exc.message, exc.param)
        except SchemeChanged as exc:
            reply = ("scheme", seq, exc.scheme)
        except Exception as exc:  # the front fails this request open, as one process would
            log.exception("decision failed for request %s", ask.request_id)
            reply = ("failed", seq, f"{type(exc).__name__}: {exc}")
        stream.send(reply)
