"""What only our own gRPC stack (``extproc.protocol.h2_server``) decides, seen by a real grpcio client: the status
codes grpcio's server would give for methods it does not serve, limits and bad messages, and stopping. (Every
exchange and health test of this package runs on both stacks: ``each_grpc_server``.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.protocol import ProcessorOptions, http2
from extproc.protocol.h2_server import H2Server, _Connection, grpc_frame, start_h2_server
from extproc.protocol.pb import external_processor_pb2_grpc
from extproc.types import EndpointId, HttpRequest, Route
from tests.protocol.extproc_wire import body_msg, chat_body, connected, headers_msg, run_exchange


class FixedHandler:
    async def route(self, request: HttpRequest) -> Route:
        return Route((EndpointId("10.0.0.1:8000"),))


@asynccontextmanager
async def h2_serving(max_receive_bytes: int = 64 << 20) -> AsyncIterator[tuple[H2Server, grpc.aio.Channel]]:
    server = await start_h2_server(FixedHandler(), port=0, max_receive_bytes=max_receive_bytes)
    async with connected(server) as channel:
        yield server, channel


async def test_a_method_it_does_not_serve_is_unimplemented() -> None:
    async with h2_serving() as (_, channel):
        call = channel.unary_unary("/no.such.Service/Method")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"", timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await watch.read()
        assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_a_message_over_the_limit_is_resource_exhausted_and_the_connection_serves_on() -> None:
    async with h2_serving(max_receive_bytes=4096) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        big = [headers_msg(), body_msg(chat_body(text="x" * 8192), eos=True)]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await run_exchange(stub, big)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        small = await run_exchange(stub, [headers_msg(), body_msg(chat_body(), eos=True)])
        assert small.code == grpc.StatusCode.OK
        assert small.kinds() == ["request_headers", "request_body"]


async def test_a_message_that_does_not_parse_is_internal() -> None:
    async with h2_serving() as (_, channel):
        call = channel.stream_stream("/envoy.service.ext_proc.v3.ExternalProcessor/Process")
        stream = call(timeout=5)
        await stream.write(b"\xff\xff\xff")  # not a ProcessingRequest
        await stream.done_writing()
        assert await stream.code() == grpc.StatusCode.INTERNAL


async def test_many_streams_on_one_connection_are_answered_independently() -> None:
    async with h2_serving() as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        messages = [headers_msg(), body_msg(chat_body(), eos=True)]
        results = await asyncio.gather(*(run_exchange(stub, messages) for _ in range(50)))
    assert {r.code for r in results} == {grpc.StatusCode.OK}
    assert {tuple(r.kinds()) for r in results} == {("request_headers", "request_body")}


async def test_stop_reports_not_serving_then_refuses_new_connections() -> None:
    server = await start_h2_server(FixedHandler(), port=0, max_receive_bytes=1 << 20, options=ProcessorOptions())
    port = server.port
    await server.stop(grace_s=0.5)
    assert set(server.health.values()) == {health_pb2.HealthCheckResponse.NOT_SERVING}
    with pytest.raises(OSError):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()


async def raw_exchange(port: int, path: bytes) -> list[tuple[int, int, bytes]]:
    """A request of headers alone (END_STREAM on HEADERS, no message), sent frame by frame: what comes back on
    stream 1, as (type, flags, payload), until our side ends it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x"),
               (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip
    writer.write(http2.PREFACE + http2.frame(http2.SETTINGS, 0, 0))
    writer.write(http2.frame(http2.HEADERS, http2.END_HEADERS | http2.END_STREAM, 1, hpack.Encoder().encode(headers)))
    frames: list[tuple[int, int, bytes]] = []
    try:
        async with asyncio.timeout(5):
            while not frames or not frames[-1][1] & http2.END_STREAM:
                head = await reader.readexactly(9)
                payload = await reader.readexactly(int.from_bytes(head[:3], "big"))
                if int.from_bytes(head[5:9], "big") == 1:
                    frames.append((head[3], head[4], payload))
    finally:
        writer.close()
    return frames


@pytest.mark.parametrize(("path", "status"), [(b"/grpc.health.v1.Health/Check", b"13"),
                                              (b"/envoy.service.ext_proc.v3.ExternalProcessor/Process", b"0")])  # fmt: skip
async def test_a_request_of_headers_alone_is_answered_at_once(path: bytes, status: bytes) -> None:
    server = await start_h2_server(FixedHandler(), port=0, max_receive_bytes=1 << 20)
    try:
        frames = await raw_exchange(server.port, path)
    finally:
        await server.stop(grace_s=0.1)
    decoded = dict(hpack.Decoder().decode(b"".join(p for kind, _, p in frames if kind == http2.HEADERS), raw=True))
    assert decoded[b"grpc-status"] == status


class _Transport(asyncio.Transport):
    """A connection's transport that drops what is written."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def close(self) -> None:
        pass


PROCESS = b"/envoy.service.ext_proc.v3.ExternalProcessor/Process"


async def test_trailers_waiting_on_the_peers_window_do_not_spin_the_stream() -> None:
    # a peer that grants 10 bytes per stream: our reply and trailers wait for its WINDOW_UPDATE; the client's
    # END_STREAM meanwhile once made the stream start an answering task per loop turn, each finding nothing
    server = H2Server(FixedHandler(), ProcessorOptions(), max_receive_bytes=1 << 20, ready=True)
    conn = _Connection(server)
    conn.connection_made(_Transport())
    tiny_window = http2.frame(http2.SETTINGS, 0, 0, (4).to_bytes(2, "big") + (10).to_bytes(4, "big"))
    headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", PROCESS), (b":authority", b"x"),
               (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip
    messages = grpc_frame(headers_msg().SerializeToString()) + grpc_frame(
        body_msg(chat_body(), eos=True).SerializeToString()
    )
    conn.data_received(
        http2.PREFACE + tiny_window + http2.frame(http2.HEADERS, http2.END_HEADERS, 1, hpack.Encoder().encode(headers))
        + http2.frame(http2.DATA, http2.END_STREAM, 1, messages)
    )  # fmt: skip
    for _ in range(50):
        await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
    conn.data_received(http2.frame(http2.WINDOW_UPDATE, 0, 1, (1 << 20).to_bytes(4, "big")))
    assert conn.busy is False  # the reply and the trailers went out
