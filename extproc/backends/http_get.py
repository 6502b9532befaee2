"""A minimal keep-alive HTTP/1.1 GET client for the one request the picker makes many times a second.

Scraping ``/metrics`` every 100 ms per endpoint is the picker's largest fixed cost; a general client
(aiohttp) spends ~0.13 ms of CPU per GET on features this request never uses. ``HttpGetter`` keeps one
connection per getter, writes one pre-built request, and reads a ``Content-Length`` or ``chunked`` body
with an ``asyncio.Protocol`` (no stream or task per request). Plain ``http://`` only; anything else (TLS,
redirects, proxies) belongs to aiohttp, which the scraper keeps for those URLs.

``PolledGetter`` is the same GET without the event loop: it writes the request on a non-blocking socket that
nothing watches and reads the answer only when asked (``collect``), so an answer does not wake the process.

Failures raise ``GetUnreachable`` (connect refused / reset before an answer: the server is down) or
``GetFailed`` (malformed answer, too large, timeout; its ``GetStatus`` for a status not 2xx). A failed
connection is dropped and re-opened on the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

__all__ = [
    "GetFailed",
    "GetStatus",
    "GetUnreachable",
    "HttpGetter",
    "IdleConnectionLost",
    "PolledGetter",
    "parse_answer",
    "parse_http_url",
    "polled_target",
]

MAX_BODY_BYTES = 8 << 20  # a /metrics page is ~10-100 KB; a server sending more is misbehaving
_MAX_HEAD_BYTES = 64 << 10
_READ_BYTES = 256 << 10  # one recv: a narrowed vLLM page is ~4 KB, a whole one ~60 KB


class GetFailed(Exception):
    """The server answered badly, too slowly, or not in HTTP."""


class GetStatus(GetFailed):
    """The server answered with a status other than 2xx (``status``)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class GetUnreachable(GetFailed):
    """No connection, or the connection closed before any answer: the server is down or restarting."""


class IdleConnectionLost(GetUnreachable):
    """A kept-alive connection that had carried answers closed before answering the next GET: the server
    dropped it while idle (not yet a failure: the GET goes again on a new connection)."""


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


def parse_answer(buf: bytearray) -> tuple[int, bytes, bool] | None:
    """``(status, body, the server closes the connection)`` once ``buf`` holds one whole response; None while it
    does not. Raises ``GetFailed`` for an answer that is not HTTP/1.x, too large, or framed neither by
    ``Content-Length`` nor ``chunked``."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > _MAX_HEAD_BYTES:
            raise GetFailed("response head too large")
        return None
    head = bytes(buf[:end]).decode("latin-1").split("\r\n")
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
        body = _chunked(buf, body_start)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise GetFailed("bad Content-Length") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise GetFailed(f"body of {length} bytes")
        body = bytes(buf[body_start : body_start + length]) if len(buf) >= body_start + length else None
    else:
        raise GetFailed("response without Content-Length or chunked encoding")
    if body is None:
        return None
    return int(status_line[1]), body, headers.get("connection", "").lower() == "close"


def _chunked(buf: bytearray, at: int) -> bytes | None:
    out = bytearray()
    while True:
        line_end = buf.find(b"\r\n", at)
        if line_end < 0:
            return None
        try:
            size = int(bytes(buf[at:line_end]).split(b";", 1)[0], 16)
        except ValueError:
            raise GetFailed("bad chunk size") from None
        if size == 0:
            return bytes(out) if buf.find(b"\r\n", line_end + 2) >= 0 else None  # trailers end
        start = line_end + 2
        if len(buf) < start + size + 2:
            return None
        out += buf[start : start + size]
        if len(out) > MAX_BODY_BYTES:
            raise GetFailed("chunked body too large")
        at = start + size + 2


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
                done = parse_answer(self._buf)
            except GetFailed as exc:
                self._waiter.set_exception(exc)
                return
            if done is not None:
                status, body, closing = done
                if closing and self.transport is not None:
                    self.transport.close()
                self._waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done():
            error = GetUnreachable if not self._buf else GetFailed
            self._waiter.set_exception(error(f"connection closed{': ' + str(exc) if exc else ''}"))

    def expect(self) -> asyncio.Future[tuple[int, bytes]]:
        self._buf.clear()
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter


class HttpGetter:
    """GETs one URL again and again over a kept-alive connection; not for concurrent use (one loop calls it)."""

    def __init__(self, host: str, port: int, path: str, *, timeout_s: float) -> None:
        self._host, self._port, self._timeout_s = host, port, timeout_s
        host_header = f"[{host}]" if ":" in host else host
        self._request = f"GET {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\nAccept: text/plain\r\n\r\n".encode()
        self._conn: _Response | None = None

    async def get(self) -> bytes:
        """The body of a 2xx answer. Raises ``GetUnreachable`` / ``GetFailed``; never anything else."""
        with _closed_on_failure(self.close):
            try:
                # asyncio.timeout, not wait_for: wait_for wraps the call in a task of its own, and in 3.11 it can
                # swallow a cancellation that arrives as the call completes (gh-86296; extproc/tasks.py)
                async with asyncio.timeout(self._timeout_s):
                    return await self._get()
            except TimeoutError:
                raise GetFailed(f"no answer within {self._timeout_s}s") from None

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


@contextlib.contextmanager
def _closed_on_failure(close: Callable[[], None], reset: type[GetUnreachable] = GetUnreachable) -> Iterator[None]:
    """Run the block; on a failure close the connection, and raise an ``OSError`` as ``reset``."""
    try:
        yield
    except GetFailed:
        close()
        raise
    except OSError as exc:
        close()
        raise reset(f"{type(exc).__name__}: {exc}") from exc


def polled_target(url: str) -> tuple[str, int, str] | None:
    """``parse_http_url(url)`` when ``PolledGetter`` can serve it (the host is an IP address: a name would need
    a blocking lookup), else None."""
    target = parse_http_url(url)
    if target is None:
        return None
    try:
        ipaddress.ip_address(target[0])
    except ValueError:
        return None
    return target


class PolledGetter:
    """GETs one URL (``polled_target``) again and again over a kept-alive connection, read only when asked.

    ``ready`` (awaited) makes sure of a connection, opening one if the server closed the last; ``send`` writes the
    request on a non-blocking socket that no event loop watches; ``collect`` reads whatever has arrived, without
    waiting: the body once the answer is whole, else None. Why: every answer an event loop waits for wakes the
    process, and on a VM a wake-up costs about what reading a small page does (``bench/results/scrape-cost``).
    One GET at a time (``busy``); not thread-safe.

    Failures, raised by ``ready``, ``send`` or ``collect`` (the connection is then closed and ``busy`` is False):
    ``GetUnreachable`` (refused, reset or closed before any answer; ``IdleConnectionLost`` when the connection had
    carried answers before), ``GetStatus`` (not 2xx), ``GetFailed`` (no connection or no whole answer within
    ``timeout_s``, or a malformed answer).
    """

    def __init__(
        self, host: str, port: int, path: str, *, timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._address = (host, port)
        self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
        host_header = f"[{host}]" if ":" in host else host
        self._request = f"GET {path} HTTP/1.1\r\nHost: {host_header}:{port}\r\nAccept: text/plain\r\n\r\n".encode()
        self._timeout_s = timeout_s
        self._clock = clock
        self._sock: socket.socket | None = None
        self._sent_at: float | None = None  # when the GET in progress was sent; None: none is
        self._answered = 0  # answers this connection carried
        self._buf = bytearray()

    @property
    def busy(self) -> bool:
        """A GET was sent and its answer not yet collected (nor failed)."""
        return self._sent_at is not None

    @property
    def sent_at_s(self) -> float | None:
        """When the GET in progress was sent (``clock``); None when none is. The page it brings back shows the
        server as it was then, give or take the server's time to write it."""
        return self._sent_at

    @property
    def connected(self) -> bool:
        """A connection is open (``send`` may go without ``ready``; if the server dropped it while idle, the
        GET's ``collect`` says so with ``IdleConnectionLost``)."""
        return self._sock is not None

    async def ready(self) -> None:
        """Keep the kept-alive connection, or open a new one when there is none or the server closed it while
        idle (the one wait of this client, and a rare one)."""
        if self._sock is not None and not self._closed_while_idle():
            return
        self.close()
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(self._timeout_s):
                await asyncio.get_running_loop().sock_connect(sock, self._address)
        except TimeoutError:
            sock.close()
            raise GetFailed(f"no connection within {self._timeout_s}s") from None
        except OSError as exc:
            sock.close()
            raise GetUnreachable(f"{type(exc).__name__}: {exc}") from exc
        self._sock, self._answered = sock, 0

    def send(self) -> None:
        """Send a GET on the connection ``ready`` made sure of (never while ``busy``)."""
        if self._sent_at is not None or self._sock is None:
            raise RuntimeError("send() needs a ready connection and no GET in progress")
        with _closed_on_failure(self.close):
            if self._sock.send(self._request) != len(self._request):  # ~0.5 KB into an idle socket's buffer
                raise GetFailed("the request did not fit the socket's buffer")
        self._sent_at = self._clock()

    def collect(self) -> bytes | None:
        """The body of the GET in progress once its 2xx answer is whole; None while it is not, or when no GET is
        in progress. Never waits."""
        if self._sent_at is None:
            return None
        with _closed_on_failure(self.close, self._lost()):  # (a reset)
            return self._collect()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._sent_at = None
        self._buf.clear()

    def _lost(self) -> type[GetUnreachable]:
        """What a connection closed or reset before answering means: dropped while idle if it had answered."""
        return IdleConnectionLost if self._answered else GetUnreachable

    def _closed_while_idle(self) -> bool:
        """The server closed the kept-alive connection (or wrote to it unasked): it cannot carry the next GET."""
        assert self._sock is not None
        try:
            self._sock.recv(1, socket.MSG_PEEK)  # returns b"" (closed) or bytes nobody asked for: unusable either way
        except BlockingIOError:
            return False  # nothing to read: still open
        except OSError:
            pass
        return True

    def _collect(self) -> bytes | None:
        sock = self._sock
        assert sock is not None and self._sent_at is not None
        closed = False  # the server closed its side (after answering, or instead)
        while not closed:
            try:
                data = sock.recv(_READ_BYTES)
            except BlockingIOError:
                break
            closed = not data
            self._buf += data
            if len(self._buf) > MAX_BODY_BYTES + _MAX_HEAD_BYTES:
                raise GetFailed("answer too large")
        answer = parse_answer(self._buf)
        if answer is None:
            if closed and self._buf:
                raise GetFailed("connection closed mid-answer")
            if closed:
                raise self._lost()("connection closed")
            if self._clock() - self._sent_at > self._timeout_s:
                raise GetFailed(f"no answer within {self._timeout_s}s")
            return None
        status, body, closing = answer
        self._sent_at = None
        self._answered += 1
        self._buf.clear()
        if closing or closed:
            self.close()
        if not 200 <= status < 300:
            raise GetStatus(status)
        return body
