"""A minimal keep-alive HTTP/1.1 GET client for the one request the picker makes many times a second.

Scraping ``/metrics`` every 100 ms per endpoint is the picker's largest fixed cost; a general client
(aiohttp) spends ~0.13 ms of CPU per GET on features this request never uses. ``HttpGetter`` keeps one
connection per getter, writes one pre-built request, and reads a ``Content-Length`` or ``chunked`` body
with an ``asyncio.Protocol`` (no stream or task per request). Plain ``http://`` only; anything else (TLS,
redirects, proxies) belongs to aiohttp, which the scraper keeps for those URLs.

Failures raise ``GetUnreachable`` (connect refused / reset before an answer: the server is down) or
``GetFailed`` (malformed answer, too large, timeout; its ``GetStatus`` for a status not 2xx). A failed
connection is dropped and re-opened on the next call.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

__all__ = ["GetFailed", "GetStatus", "GetUnreachable", "HttpGetter", "parse_http_url"]

MAX_BODY_BYTES = 8 << 20  # a /metrics page is ~10-100 KB; a server sending more is misbehaving
_MAX_HEAD_BYTES = 64 << 10


class GetFailed(Exception):
    """The server answered badly, too slowly, or not in HTTP."""


class GetStatus(GetFailed):
    """The server answered with a status other than 2xx (``status``)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class GetUnreachable(GetFailed):
    """No connection, or the connection closed before any answer: the server is down or restarting."""


def parse_http_url(url: str) -> tuple[str, int, str] | None:
    """``(host, port, path?query)`` of a plain ``http://`` URL, or None for anything this client does not do."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.username or parts.password:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.hostname, port, path


class _Response(asyncio.Protocol):
    """Collects one response at a time on a kept-alive connection."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._waiter is not None and not self._waiter.done():
            try:
                done = self._parse()
            except GetFailed as exc:
                self._waiter.set_exception(exc)
                return
            if done is not None:
                self._waiter.set_result(done)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            error = GetUnreachable if not self._buf else GetFailed
            self._waiter.set_exception(error(f"connection closed{': ' + str(exc) if exc else ''}"))

    def expect(self) -> asyncio.Future[tuple[int, bytes]]:
        self._buf.clear()
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def _parse(self) -> tuple[int, bytes] | None:
        """(status, body) once the whole response is in the buffer; None while it is not."""
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > _MAX_HEAD_BYTES:
                raise GetFailed("response head too large")
            return None
        head = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
        status_line = head[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1.") or not status_line[1].isdigit():
            raise GetFailed(f"not an HTTP/1.x answer: {head[0][:80]!r}")
        headers = {}
        for line in head[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        body_start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked(body_start)
        elif "content-length" in headers:
            try:
                length = int(headers["content-length"])
            except ValueError:
                raise GetFailed("bad Content-Length") from None
            if length < 0 or length > MAX_BODY_BYTES:
                raise GetFailed(f"body of {length} bytes")
            body = bytes(self._buf[body_start : body_start + length]) if len(self._buf) >= body_start + length else None
        else:
            raise GetFailed("response without Content-Length or chunked encoding")
        if body is None:
            return None
        if headers.get("connection", "").lower() == "close" and self.transport is not None:
            self.transport.close()
        return int(status_line[1]), body

    def _chunked(self, at: int) -> bytes | None:
        out = bytearray()
        while True:
            line_end = self._buf.find(b"\r\n", at)
            if line_end < 0:
                return None
            try:
                size = int(bytes(self._buf[at:line_end]).split(b";", 1)[0], 16)
            except ValueError:
                raise GetFailed("bad chunk size") from None
            if size == 0:
                return bytes(out) if self._buf.find(b"\r\n", line_end + 2) >= 0 else None  # trailers end
            start = line_end + 2
            if len(self._buf) < start + size + 2:
                return None
            out += self._buf[start : start + size]
            if len(out) > MAX_BODY_BYTES:
                raise GetFailed("chunked body too large")
            at = start + size + 2


class HttpGetter:
    """GETs one URL again and again over a kept-alive connection; not for concurrent use (one loop calls it)."""

    def __init__(self, host: str, port: int, path: str, *, timeout_s: float) -> None:
        self._host, self._port, self._timeout_s = host, port, timeout_s
        host_header = f"[{host}]" if ":" in host else host
        self._request = f"GET {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\nAccept: text/plain\r\n\r\n".encode()
        self._conn: _Response | None = None

    async def get(self) -> bytes:
        """The body of a 2xx answer. Raises ``GetUnreachable`` / ``GetFailed``; never anything else."""
        try:
            # asyncio.timeout, not wait_for: wait_for wraps the call in a task of its own, and in 3.11 it can
            # swallow a cancellation that arrives as the call completes (gh-86296; extproc/tasks.py)
            async with asyncio.timeout(self._timeout_s):
                return await self._get()
        except TimeoutError:
            self.close()
            raise GetFailed(f"no answer within {self._timeout_s}s") from None
        except GetFailed:
            self.close()
            raise
        except OSError as exc:
            self.close()
            raise GetUnreachable(f"{type(exc).__name__}: {exc}") from exc

    async def _get(self) -> bytes:
        conn = self._conn
        if conn is not None and not conn.closed and conn.transport is not None and not conn.transport.is_closing():
            try:
                return await self._exchange(conn)
            except GetUnreachable:  # the server closed the idle connection meanwhile: not a failure yet
                self.close()
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Response, self._host, self._port)
        self._conn = conn
        return await self._exchange(conn)

    async def _exchange(self, conn: _Response) -> bytes:
        waiter = conn.expect()
        assert conn.transport is not None
        conn.transport.write(self._request)
        status, body = await waiter
        if not 200 <= status < 300:
            raise GetStatus(status)
        return body

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None
