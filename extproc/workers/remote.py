"""The front's side of the local socket: a ``Decider`` whose decisions are made by the main process.

``decide`` sends the ask and waits for its reply (matched by sequence number; asks from concurrent streams
are in flight together). Replies are mapped back to what a ``LocalDecider`` would have done: a ``Route``, the
same ``RouterError`` class, or ``SchemeChanged`` (after updating the front's scheme table through
``on_scheme``). A decider that does not answer within ``timeout_s`` (or has gone) makes the request a
``PassThrough`` (Envoy's own balancing serves it, as when one process's handler fails), counted through
``on_unavailable`` and logged at most once per ``_LOG_EVERY_S``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from extproc import errors
from extproc.decider import Ask, SchemeChanged
from extproc.types import EndpointId, HashScheme, PassThrough, Route
from extproc.workers import frames

log = logging.getLogger(__name__)

_LOG_EVERY_S = 10.0


class DeciderUnavailable(Exception):
    """The decider process did not answer (gone, or slower than the ask's timeout)."""


def _error_class(name: str) -> type[errors.RouterError]:
    found = getattr(errors, name, None)
    if isinstance(found, type) and issubclass(found, errors.RouterError):
        return found
    return errors.RouterError


class RemoteDecider:
    """A ``Decider`` over a connected socket (``connect``); ``closed`` is set when the socket closes."""

    def __init__(
        self,
        *,
        timeout_s: float,
        on_scheme: Callable[[str, HashScheme], None],
        on_unavailable: Callable[[], None] = lambda: None,
    ) -> None:
        self._timeout_s = timeout_s
        self._on_scheme = on_scheme
        self._on_unavailable = on_unavailable
        self._logged_at = float("-inf")
        self._seq = 0
        self._pending: dict[int, asyncio.Future[frames.Frame]] = {}
        self._stream = frames.FrameStream(self._on_frame, self._on_closed)
        self.closed = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        path: str,
        *,
        timeout_s: float,
        on_scheme: Callable[[str, HashScheme], None],
        on_unavailable: Callable[[], None] = lambda: None,
    ) -> RemoteDecider:
        remote = cls(timeout_s=timeout_s, on_scheme=on_scheme, on_unavailable=on_unavailable)
        await asyncio.get_running_loop().create_unix_connection(lambda: remote._stream, path)
        return remote

    def send(self, frame: frames.Frame) -> None:
        """Write one frame (``ready``, ``stats``, ``served``); dropped once the socket is closed."""
        self._stream.send(frame)

    async def decide(self, ask: Ask) -> Route | PassThrough:
        try:
            return await self._ask(ask)
        except DeciderUnavailable as exc:
            self._on_unavailable()
            now = asyncio.get_running_loop().time()
            if now - self._logged_at >= _LOG_EVERY_S:
                self._logged_at = now
                log.warning("request %s passed through: %s", ask.request_id, exc)
            return PassThrough()

    async def _ask(self, ask: Ask) -> Route | PassThrough:
        if self.closed.is_set():
            raise DeciderUnavailable("the decider process has gone")
        self._seq += 1
        seq = self._seq
        future: asyncio.Future[frames.Frame] = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        self.send(("ask", seq, ask))
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await future
        except TimeoutError:
            raise DeciderUnavailable(f"no decision within {self._timeout_s}s") from None
        finally:
            self._pending.pop(seq, None)
        return self._outcome(reply, ask.base_model)

    def _outcome(self, reply: frames.Frame, base_model: str) -> Route | PassThrough:
        kind = reply[0]
        if kind == "route":
            return Route(tuple(EndpointId(e) for e in reply[2]), dict(reply[3]))
        if kind == "pass":
            return PassThrough()
        if kind == "refused":
            raise _error_class(reply[2])(reply[3], param=reply[4])
        if kind == "scheme":
            self._on_scheme(base_model, reply[2])
            raise SchemeChanged(reply[2])
        raise DeciderUnavailable(f"the decision failed: {reply[2] if len(reply) > 2 else reply}")

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        self.send(("served", request_id, endpoint))

    async def drain(self) -> None:
        """Nothing to drain here: the decider's writes happen in its own process."""

    async def close(self) -> None:
        self._stream.close()
        self._on_closed()

    def _on_frame(self, frame: frames.Frame) -> None:
        future = self._pending.get(frame[1])
        if future is not None and not future.done():
            future.set_result(frame)

    def _on_closed(self) -> None:
        self.closed.set()
        for future in list(self._pending.values()):
            if not future.done():
                future.set_exception(DeciderUnavailable("the decider process has gone"))
