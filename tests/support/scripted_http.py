"""A scripted HTTP/1.1 server on 127.0.0.1 for client tests: each GET answered with raw bytes from a script."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Reply = Callable[[int], bytes | None]  # request number on this server -> raw answer (None: close at once)


class ScriptedServer:
    """Answers each GET with ``reply(n)``; counts connections and records each request's target in ``paths``
    (``reply`` may read ``paths[n]``); ``close_after`` closes a connection after one answer."""

    def __init__(self, reply: Reply, *, close_after: bool = False, delay_s: float = 0.0) -> None:
        self.reply, self.close_after, self.delay_s = reply, close_after, delay_s
        self.requests = 0
        self.connections = 0
        self.paths: list[str] = []  # the request line's target ("/metrics?x=1"), one per request
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.paths.append(head.split(b" ", 2)[1].decode("latin-1"))
                answer = self.reply(self.requests)
                self.requests += 1
                await asyncio.sleep(self.delay_s)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body
