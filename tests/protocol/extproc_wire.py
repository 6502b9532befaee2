"""Test helpers: ext_proc messages as Envoy sends them; scripted exchanges through a real gRPC client."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest

from extproc.protocol import ProcessorOptions, RouteHandler
from extproc.protocol.pb import (
    core_pb2,
    external_processor_pb2,
    external_processor_pb2_grpc,
    processing_mode_pb2,
)
from extproc.protocol.server import ExtProcServer, GrpcServerKind, start_ext_proc

pb = external_processor_pb2
Mode = processing_mode_pb2.ProcessingMode
CHAT_HEADERS = {
    ":method": "POST",
    ":path": "/v1/chat/completions",
    ":authority": "gw",
    "content-type": "application/json",
    "x-request-id": "req-1",
}


def chat_body(model: str = "m", text: str = "hi") -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()


def metadata(namespaces: Mapping[str, Mapping[str, Any]]) -> core_pb2.Metadata:
    md = core_pb2.Metadata()
    for name, values in namespaces.items():
        md.filter_metadata[name].update(values)
    return md


def headers_msg(
    headers: Mapping[str, str] = CHAT_HEADERS,
    *,
    eos: bool = False,
    mode: int | None = None,
    subset: object | None = None,
) -> pb.ProcessingRequest:
    """``request_headers`` as Envoy sends it: values in ``raw_value``; ``protocol_config`` when ``mode``."""
    values = [core_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=core_pb2.HeaderMap(headers=values), end_of_stream=eos)
    )
    if mode is not None:
        msg.protocol_config.request_body_mode = mode  # type: ignore[assignment]
    if subset is not None:
        hint = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": subset}}
        msg.metadata_context.CopyFrom(metadata(hint))
    return msg


def body_msg(data: bytes, *, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


def trailers_msg() -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_trailers=pb.HttpTrailers())


def chunks(data: bytes, size: int) -> list[pb.ProcessingRequest]:
    """``data`` as FULL_DUPLEX body messages of ``size`` bytes, the last one with ``end_of_stream``."""
    starts = range(0, len(data), size)
    return [body_msg(data[s : s + size], eos=s + size >= len(data)) for s in starts]


@dataclass
class Result:
    """What the client saw: replies (each with how many requests had been written when it arrived), status."""

    replies: list[pb.ProcessingResponse] = field(default_factory=list)
    written_at: list[int] = field(default_factory=list)
    code: grpc.StatusCode | None = None

    def kinds(self) -> list[str]:
        return [str(r.WhichOneof("response")) for r in self.replies]


async def run_exchange(
    stub: external_processor_pb2_grpc.ExternalProcessorStub,
    messages: Sequence[pb.ProcessingRequest],
    *,
    gap_s: float = 0.0,
    timeout_s: float = 10.0,
) -> Result:
    """Write ``messages`` (``gap_s`` apart) while reading replies until the server ends the call.

    Writing stops early once the server has ended the call (as Envoy's would).
    """
    call = stub.Process(timeout=timeout_s)
    result = Result()
    written = 0

    async def reader() -> None:
        while (reply := await call.read()) is not grpc.aio.EOF:
            result.replies.append(reply)
            result.written_at.append(written)

    reading = asyncio.create_task(reader())
    for msg in messages:
        if call.done():
            break
        try:
            await call.write(msg)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            break  # the server ended the call between our check and the write
        written += 1
        await asyncio.sleep(gap_s)
    if not call.done():
        await call.done_writing()
    await reading
    result.code = await call.code()
    return result


SERVER_KINDS: tuple[GrpcServerKind, ...] = ("grpcio", "h2")
server_kind: GrpcServerKind = "grpcio"  # which stack ``serving`` starts; the ``each_grpc_server`` fixture sets it


@pytest.fixture(params=SERVER_KINDS)
def each_grpc_server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> GrpcServerKind:
    """Run a test once per gRPC stack (``listen.grpc_server``): the same client, the same expectations."""
    monkeypatch.setattr(sys.modules[__name__], "server_kind", request.param)
    return cast(GrpcServerKind, request.param)


@asynccontextmanager
async def serving(
    handler: RouteHandler, options: ProcessorOptions | None = None, **kwargs: Any
) -> AsyncIterator[tuple[ExtProcServer, grpc.aio.Channel]]:
    """A real server (``server_kind``) on 127.0.0.1:<free port> and a channel to it; both closed on exit."""
    options = options or ProcessorOptions()
    server = await start_ext_proc(handler, kind=server_kind, host="127.0.0.1", port=0, options=options, **kwargs)
    async with connected(server) as channel:
        yield server, channel


@asynccontextmanager
async def connected(server: ExtProcServer) -> AsyncIterator[grpc.aio.Channel]:
    """A channel to the started ``server``; on exit the channel closes and the server stops."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(grace_s=None)


def header_values(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def error_json(reply: pb.ProcessingResponse) -> dict[str, Any]:
    return json.loads(reply.immediate_response.body)  # type: ignore[no-any-return]
