"""The ext_proc server on our own HTTP/2 (``extproc.protocol.http2``) and gRPC framing: the same ``Exchange`` and
health service as ``extproc.protocol.server``, without grpc.aio.

Why: grpc.aio costs ~2 ms of CPU per ext_proc request on a 2-core box before any decision (``bench.extproc_floor``:
a servicer with canned replies), 5-7x what the picker's own decision costs at 1K tokens (``bench.route_cost``).
An asyncio protocol that speaks the little of gRPC that Envoy's ext_proc client and its gRPC health checker use
does the same exchange in a few function calls per frame (``http2`` says why not the ``h2`` library either).

What it serves (``listen.grpc_server: h2``), over cleartext HTTP/2 (prior knowledge, as Envoy's gRPC clients do):

- ``/envoy.service.ext_proc.v3.ExternalProcessor/Process``: a bidirectional stream; each length-prefixed
  ``ProcessingRequest`` goes to the stream's ``Exchange`` in order and its replies go back as they come; the
  stream ends with ``grpc-status: 0`` once the exchange is finished (close-after-pick) or the client half-closes.
- ``/grpc.health.v1.Health/Check``: unary, the statuses ``RunningServer.set_ready`` and ``stop`` set (``""``,
  ``liveness``, the ext_proc service name: SERVING; ``readiness`` as set); an unknown service gets NOT_FOUND.
- anything else (``Health/Watch`` included): UNIMPLEMENTED.

Errors: a compressed message (we advertise no ``grpc-encoding``) or a message that does not parse gets
INTERNAL; one larger than the receive limit gets RESOURCE_EXHAUSTED (as grpcio answers them). A handler bug in
``Exchange`` gets UNKNOWN and is logged. Replies respect the peer's flow-control windows (a FULL_DUPLEX body
echo can be larger than them); we grant large receive windows so a BUFFERED body is not paced by
WINDOW_UPDATE round trips.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from extproc import wire
from extproc.protocol import constants, http2
from extproc.protocol.exchange import Exchange, ProcessorOptions
from extproc.protocol.handler import RouteHandler
from extproc.protocol.pb import external_processor_pb2

__all__ = ["H2Server", "start_h2_server"]

log = logging.getLogger(__name__)
pb = external_processor_pb2

PROCESS_PATH = f"/{constants.SERVICE_NAME}/Process".encode()
HEALTH_CHECK_PATH = b"/grpc.health.v1.Health/Check"
WINDOW_BYTES = 16 << 20  # per stream and per connection: a BUFFERED body arrives without waiting on updates
MAX_FRAME_BYTES = 1 << 20  # fewer, larger DATA frames for long bodies (the peer may send up to this)
_PREFIX = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length

# gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)
OK, UNKNOWN, NOT_FOUND, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 2, 5, 8, 12, 13

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_RESPONSE_HEADERS = http2.encode_headers(((b":status", b"200"), (b"content-type", b"application/grpc")))
_OK_TRAILERS = http2.encode_headers(((b"grpc-status", b"0"),))


def _trailers(code: int, message: str) -> bytes:
    fields = [(b"grpc-status", str(code).encode())]
    if message:
        fields.append((b"grpc-message", _percent_encode(message)))
    return http2.encode_headers(fields)


def grpc_frame(message: bytes) -> bytes:
    """One uncompressed, length-prefixed gRPC message."""
    return _PREFIX.pack(0, len(message)) + message


@dataclass(slots=True)
class _Stream:
    """One HTTP/2 stream: what has arrived (``inbox``: bytes not yet a whole message), what waits to be sent
    (``outbox``, paced by flow control), and whether our side is done."""

    stream_id: int
    path: bytes
    inbox: bytearray = field(default_factory=bytearray)
    messages: deque[bytes] = field(default_factory=deque)
    outbox: bytearray = field(default_factory=bytearray)
    headers_sent: bool = False
    trailers: bytes | None = None  # an encoded header block, sent once the outbox is empty
    client_done: bool = False  # END_STREAM received
    closed: bool = False  # our trailers sent, or reset
    task: asyncio.Task[None] | None = None
    exchange: Exchange | None = None


class _Connection(asyncio.Protocol):
    """One client connection: its framing (``http2.Http2Connection``), its streams, and the tasks that answer
    them. Implements ``http2.StreamHandler``."""

    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._h2 = http2.Http2Connection(self, window_bytes=WINDOW_BYTES, max_frame_bytes=MAX_FRAME_BYTES)
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}

    # -- asyncio.Protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._server.connections.add(self)
        self._h2.initiate(max_concurrent_streams=1 << 16)
        self._send()

    def data_received(self, data: bytes) -> None:
        try:
            self._h2.receive(data)
        except http2.Http2Error as exc:
            log.info("HTTP/2 protocol error from an ext_proc client, closing its connection: %s", exc)
            self._send()  # the GOAWAY saying why
            self._close()
            return
        except Exception:
            log.exception("ext_proc connection failed; closing it")
            self._close()
            return
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        for stream in self._streams.values():
            stream.closed = True
            if stream.task is not None:
                stream.task.cancel()
        self._streams.clear()
        self._transport = None

    # -- http2.StreamHandler -------------------------------------------------------------------------------
    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], *, end_stream: bool, new: bool) -> None:
        if new:
            path = next((v for n, v in headers if n == b":path"), b"")
            self._on_request(stream_id, path, ended=end_stream)
            if end_stream:  # a request of headers alone: answered now (a Process stream ends OK, a check fails)
                self._wake(self._streams[stream_id])
        elif end_stream and (stream := self._streams.get(stream_id)) is not None:  # trailers: the client is done
            self._client_ended(stream)

    def on_data(self, stream_id: int, data: bytes, *, end_stream: bool) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        if data and not stream.closed:
            self._on_data(stream, data)
        if end_stream:
            self._client_ended(stream)

    def on_reset(self, stream_id: int) -> None:
        self._forget(stream_id)

    def on_window(self, stream_id: int) -> None:
        targets = list(self._streams.values()) if stream_id == 0 else [self._streams.get(stream_id)]
        for stream in targets:
            if stream is not None:
                self._flush(stream)

    def on_goaway(self) -> None:
        self._close()

    def _client_ended(self, stream: _Stream) -> None:
        if stream.closed:
            del self._streams[stream.stream_id]
        else:
            stream.client_done = True
            self._wake(stream)

    def _on_request(self, stream_id: int, path: bytes, *, ended: bool) -> None:
        stream = self._streams[stream_id] = _Stream(stream_id, path, client_done=ended)
        if stream.path == PROCESS_PATH:
            stream.exchange = Exchange(self._server.handler, self._server.options)
        elif stream.path != HEALTH_CHECK_PATH:
            self._finish(stream, UNIMPLEMENTED, f"unknown method {stream.path.decode(errors='replace')}")

    def _on_data(self, stream: _Stream, data: bytes) -> None:
        inbox = stream.inbox
        inbox += data
        while len(inbox) >= _PREFIX.size:
            compressed, length = _PREFIX.unpack_from(inbox)
            if length > self._server.max_receive_bytes:
                limit = self._server.max_receive_bytes
                self._finish(stream, RESOURCE_EXHAUSTED, f"message of {length} bytes exceeds the limit of {limit}")
                return
            if compressed:
                self._finish(stream, INTERNAL, "compressed messages are not accepted (no grpc-encoding offered)")
                return
            end = _PREFIX.size + length
            if len(inbox) < end:
                break
            stream.messages.append(bytes(inbox[_PREFIX.size : end]))
            del inbox[:end]
        self._wake(stream)

    def _wake(self, stream: _Stream) -> None:
        """Start the stream's answering task if it has work and none is running."""
        if stream.closed or stream.task is not None:
            return
        # a Process stream answers each message as it comes; a unary health check once the request is complete.
        # Once our trailers are queued (waiting on the peer's window) there is nothing left to answer: woken
        # then, a task would find nothing, end, wake the next, once per loop turn until the window opened.
        finishing = stream.trailers is not None
        due = (stream.client_done and not finishing) or (stream.exchange is not None and bool(stream.messages))
        if due:
            stream.task = asyncio.get_running_loop().create_task(self._answer(stream))

    # -- answering -----------------------------------------------------------------------------------------
    async def _answer(self, stream: _Stream) -> None:
        try:
            if stream.exchange is not None:
                await self._process(stream, stream.exchange)
            else:
                self._health_check(stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ext_proc stream %d failed", stream.stream_id)
            self._finish(stream, UNKNOWN, "internal error")
        finally:
            stream.task = None
            self._send()
        self._wake(stream)  # messages that arrived while the last one was answered

    async def _process(self, stream: _Stream, exchange: Exchange) -> None:
        while stream.messages and not stream.closed:
            try:
                message = pb.ProcessingRequest.FromString(stream.messages.popleft())
            except DecodeError as exc:
                self._finish(stream, INTERNAL, f"unparsable ProcessingRequest: {exc}")
                return
            replies = await exchange.receive(message)
            if stream.closed:  # reset while we decided
                return
            for reply in replies:
                self._reply(stream, reply.SerializeToString())
            if exchange.finished:
                self._finish(stream, OK)
                return
        if stream.client_done and not stream.closed:
            self._finish(stream, OK)

    def _health_check(self, stream: _Stream) -> None:
        if not stream.messages:
            self._finish(stream, INTERNAL, "no HealthCheckRequest")
            return
        try:
            request = health_pb2.HealthCheckRequest.FromString(stream.messages.popleft())
        except DecodeError as exc:
            self._finish(stream, INTERNAL, f"unparsable HealthCheckRequest: {exc}")
            return
        status = self._server.health.get(request.service)
        if status is None:
            self._finish(stream, NOT_FOUND, f"unknown service {request.service!r}")
            return
        self._reply(stream, health_pb2.HealthCheckResponse(status=status).SerializeToString())
        self._finish(stream, OK)

    # -- sending -------------------------------------------------------------------------------------------
    def _reply(self, stream: _Stream, message: bytes) -> None:
        if not stream.headers_sent:
            self._h2.send_headers(stream.stream_id, _RESPONSE_HEADERS)
            stream.headers_sent = True
        stream.outbox += grpc_frame(message)
        self._flush(stream)

    def _finish(self, stream: _Stream, code: int, message: str = "") -> None:
        """End our side with ``code``: after what is queued (trailers), or at once (trailers-only)."""
        if stream.closed or stream.trailers is not None:
            return
        trailers = _OK_TRAILERS if code == OK and not message else _trailers(code, message)
        if not stream.headers_sent:  # trailers-only: one HEADERS frame carries the status
            stream.headers_sent = True
            stream.trailers = _RESPONSE_HEADERS + trailers
        else:
            stream.trailers = trailers
        stream.messages.clear()
        self._flush(stream)

    def _flush(self, stream: _Stream) -> None:
        """Send what the windows allow; the trailers once everything before them went."""
        if stream.closed:
            return
        outbox = stream.outbox
        if outbox:
            size = min(self._h2.send_window(stream.stream_id), len(outbox))
            if size > 0:
                self._h2.send_data(stream.stream_id, bytes(outbox[:size]))
                del outbox[:size]
            if outbox:
                return  # on_window resumes
        if stream.trailers is not None:
            self._h2.send_headers(stream.stream_id, stream.trailers, end_stream=True)
            self._end(stream)

    def _end(self, stream: _Stream) -> None:
        stream.closed = True
        if stream.client_done:
            self._streams.pop(stream.stream_id, None)
        # else: kept until the client ends or resets it (its late messages are acknowledged and dropped)

    def _forget(self, stream_id: int) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            return
        stream.closed = True
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()

    def _send(self) -> None:
        data = self._h2.data_to_send()
        if data and self._transport is not None:
            self._transport.write(data)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- shutdown ------------------------------------------------------------------------------------------
    def go_away(self) -> None:
        """Tell the client to open no new streams here (the open ones may finish)."""
        self._h2.go_away()
        self._send()

    @property
    def busy(self) -> bool:
        return any(not s.closed for s in self._streams.values())

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class H2Server:
    """A started server: its bound ``port``, readiness control and ``stop`` (as ``server.RunningServer``)."""

    def __init__(self, handler: RouteHandler, options: ProcessorOptions, max_receive_bytes: int, ready: bool) -> None:
        self.handler = handler
        self.options = options
        self.max_receive_bytes = max_receive_bytes
        self.connections: set[_Connection] = set()
        self.health: dict[str, int] = dict.fromkeys(constants.ALWAYS_SERVING, _SERVING)
        self.health[wire.HEALTH_READINESS] = _SERVING if ready else _NOT_SERVING
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int, *, reuse_port: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_port=reuse_port)
        except OSError as exc:
            raise RuntimeError(f"cannot bind ext_proc server to {host}:{port}: {exc}") from exc
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def set_ready(self, ready: bool) -> None:
        """Flip the ``readiness`` health status (gateways stop sending traffic while NOT_SERVING)."""
        self.health[wire.HEALTH_READINESS] = _SERVING if ready else _NOT_SERVING

    async def stop(self, grace_s: float | None = None) -> None:
        """Report NOT_SERVING everywhere, stop accepting, send GOAWAY; open streams get ``grace_s`` to finish."""
        for name in self.health:
            self.health[name] = _NOT_SERVING
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.go_away()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (grace_s or 0.0)
        while any(c.busy for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()


def _percent_encode(message: str) -> bytes:
    """grpc-message is percent-encoded UTF-8 (printable ASCII but '%' passes as is)."""
    out = bytearray()
    for byte in message.encode():
        out += bytes((byte,)) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}".encode()
    return bytes(out)


async def start_h2_server(
    handler: RouteHandler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    options: ProcessorOptions = ProcessorOptions(),  # noqa: B008  (frozen dataclass)
    max_receive_bytes: int,
    ready: bool = True,
    reuse_port: bool = True,
) -> H2Server:
    """Bind and serve on ``host:port`` (0 = any free port; see ``H2Server.port``). ``reuse_port``: several
    processes may serve one port (front workers), as grpcio allows by default. Raises ``RuntimeError`` if the
    port cannot be bound."""
    server = H2Server(handler, options, max_receive_bytes, ready)
    await server.start(host, port, reuse_port=reuse_port)
    return server
