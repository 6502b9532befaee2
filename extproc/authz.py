"""The ext_authz transport: Envoy's ``envoy.filters.http.ext_authz`` HTTP service, answered from one asyncio
protocol. It is the only module that knows that wire; the router sees the same ``HttpRequest`` as over ext_proc.

Why a second transport: ``bench.extproc_floor`` measured the least a grpc.aio ext_proc server can do at 2.7 ms
of added latency and 2.2 ms of CPU per request on a 2-core box, and the same answer over ext_authz HTTP at 0.7 ms
and 0.2 ms (``bench/results/hotpath/extproc-floor.md``).

What Envoy sends (checked with Envoy 1.40, ``with_request_body``): one HTTP/1.1 request per check, with the
original method and path (query included), ``host``, ``content-length``, Envoy's ``x-request-id``, the headers
the filter's ``allowed_headers`` names, and the whole body. Our answer:

- ``Route``: ``200`` with ``x-gateway-destination-endpoint: ip:port,...`` and the route's summary headers (Envoy
  adds those that ``authorization_response.allowed_upstream_headers`` names; override_host reads the
  destination header);
- ``PassThrough``, a handler that raises something else, or one slower than ``route_timeout_s``: ``200`` with
  no headers, so Envoy's own balancing serves the request (fail open, as over ext_proc);
- ``RouterError``: its status with the OpenAI-style JSON body, which Envoy returns to the client.

A head over ``MAX_HEAD_BYTES`` or a request line that does not parse gets ``400`` and the connection closes; a
body over ``max_body_bytes`` gets ``413`` (the same JSON error as over ext_proc) and the connection closes.
Requests on one connection are answered one at a time, in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from http import HTTPStatus

from extproc import wire
from extproc.errors import BodyTooLarge, RouterError
from extproc.protocol import constants
from extproc.protocol.exchange import ProcessorOptions
from extproc.protocol.handler import RouteHandler
from extproc.protocol.inbound import request_id_of
from extproc.protocol.outbound import error_body
from extproc.types import HttpRequest, Route

__all__ = ["MAX_HEAD_BYTES", "AuthzOptions", "AuthzProtocol", "answer_of", "request_of", "start_authz_server"]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 << 10  # request line plus headers
_END_OF_HEAD = b"\r\n\r\n"
_PASS = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
_BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class BadRequest(ValueError):
    """A check request that is not HTTP/1.1 as Envoy sends it."""


@dataclass(frozen=True, slots=True)
class AuthzOptions:
    max_body_bytes: int = constants.DEFAULT_MAX_BODY_BYTES
    route_timeout_s: float | None = None  # fail open (pass through) when the handler takes longer

    @classmethod
    def like(cls, processing: ProcessorOptions) -> AuthzOptions:
        """The ext_proc servicer's limits (one config, both transports)."""
        return cls(max_body_bytes=processing.max_body_bytes, route_timeout_s=processing.route_timeout_s)


def request_of(head: bytes, body: bytes, received_at_s: float | None = None) -> HttpRequest:
    """The router's view of one check request (``head``: request line and headers, without the blank line).
    Raises ``BadRequest``."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"not a header line: {line[:80]!r}")
        key, value = name.lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value  # RFC 9110 list semantics
    method, path = parts[0], parts[1]
    headers[":method"], headers[":path"] = method, path  # as the ext_proc adapter shows them
    return HttpRequest(method=method, path=path, headers=headers, body=body, request_id=request_id_of(headers),
                       received_at_s=received_at_s)  # fmt: skip


def answer_of(result: Route | object) -> bytes:
    """The HTTP answer to Envoy for what the handler returned (a ``Route``, or anything else: pass through)."""
    if not isinstance(result, Route) or not result.endpoints:
        return _PASS
    headers = {wire.DESTINATION_HEADER: ",".join(result.endpoints)}
    headers.update((k.lower(), v) for k, v in result.headers.items())
    # a summary value may quote the client (a model name): no CR/LF may reach the answer's head
    lines = "".join(f"{k}: {_one_line(v)}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 200 OK\r\n{lines}content-length: 0\r\n\r\n".encode()


def _one_line(value: str) -> str:
    return value.replace("\r", " ").replace("\n", " ")


def error_answer(err: RouterError, *, close: bool = False) -> bytes:
    """``err`` as Envoy passes it to the client: its status and the JSON error body."""
    body = error_body(err)
    try:
        reason = HTTPStatus(err.status).phrase
    except ValueError:
        reason = "Error"
    extra = "connection: close\r\n" if close else ""
    head = f"HTTP/1.1 {err.status} {reason}\r\ncontent-type: {constants.JSON_CONTENT_TYPE}\r\n{extra}"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


class AuthzProtocol(asyncio.Protocol):
    """One Envoy connection: parse each check request, route it, answer, in order."""

    def __init__(self, handler: RouteHandler, options: AuthzOptions) -> None:
        self._handler = handler
        self._options = options
        self._pending = bytearray()  # received bytes not yet part of an answered request
        self._transport: asyncio.WriteTransport | None = None
        self._busy = False  # a request is being routed; the next waits in _pending
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        self._closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.WriteTransport):
            self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True

    def data_received(self, data: bytes) -> None:
        self._pending += data
        self._next()

    def _next(self) -> None:
        """Start routing the next complete request, if one is buffered and none is being routed."""
        if self._busy or self._closing:
            return
        end = self._pending.find(_END_OF_HEAD)
        if end < 0:
            if len(self._pending) > MAX_HEAD_BYTES:
                self._close_with(_BAD)
            return
        head = bytes(self._pending[:end])
        try:
            length = _content_length(head)
        except BadRequest:
            self._close_with(_BAD)
            return
        if length > self._options.max_body_bytes:
            err = BodyTooLarge(f"Request body exceeds the limit of {self._options.max_body_bytes} bytes.", param=None)
            self._close_with(error_answer(err, close=True))
            return
        start = end + len(_END_OF_HEAD)
        if len(self._pending) < start + length:
            return
        body = bytes(self._pending[start : start + length])
        del self._pending[: start + length]
        self._busy = True
        self._task = asyncio.get_running_loop().create_task(self._serve(head, body, time.monotonic()))

    async def _serve(self, head: bytes, body: bytes, received_at_s: float) -> None:
        try:
            request = request_of(head, body, received_at_s)
        except BadRequest:
            self._close_with(_BAD)
            return
        answer = await self._route(request)
        self._busy = False
        if self._transport is not None and not self._closing:
            self._transport.write(answer)
            self._next()

    async def _route(self, request: HttpRequest) -> bytes:
        try:
            async with asyncio.timeout(self._options.route_timeout_s):
                return answer_of(await self._handler.route(request))
        except RouterError as err:
            return error_answer(err)
        except Exception:  # fail open: Envoy's own balancing serves the request
            log.exception("route handler failed; passing request %s through", request.request_id)
            return _PASS

    def _close_with(self, answer: bytes) -> None:
        self._closing = True
        if self._transport is not None:
            self._transport.write(answer)
            self._transport.close()


def _content_length(head: bytes) -> int:
    """The request's ``content-length`` (0 when absent). Raises ``BadRequest`` for chunked or a bad value."""
    lower = head.lower()
    if b"\r\ntransfer-encoding:" in lower:
        raise BadRequest("chunked check requests are not sent by Envoy")
    at = lower.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    value = lower[at + len(b"\r\ncontent-length:") :].split(b"\r\n", 1)[0].strip()
    if not value.isdigit():
        raise BadRequest(f"content-length {value[:20]!r}")
    return int(value)


async def start_authz_server(
    handler: RouteHandler, *, host: str = "127.0.0.1", port: int = 0, options: AuthzOptions | None = None
) -> asyncio.Server:
    """Serve ext_authz checks on ``host:port`` (0: any free port; see ``server.sockets``) until closed."""
    chosen = options or AuthzOptions()
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: AuthzProtocol(handler, chosen), host, port)
