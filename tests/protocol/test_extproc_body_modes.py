"""Hermetic: the real grpc.aio server and a real gRPC client, one scripted message sequence per body mode."""

from __future__ import annotations

import grpc
import pytest

from extproc.protocol import ProcessorOptions
from extproc.protocol.pb import external_processor_pb2_grpc
from extproc.types import PassThrough, Route
from tests.protocol.extproc_fakes import A, B, FixedHandler, ListeningHandler, ModelHandler
from tests.protocol.extproc_wire import (
    CHAT_HEADERS,
    Mode,
    body_msg,
    chat_body,
    chunks,
    header_values,
    headers_msg,
    metadata,
    pb,
    run_exchange,
    serving,
    trailers_msg,
)

pytestmark = pytest.mark.usefixtures("each_grpc_server")  # every test once per gRPC stack

DEST = "x-gateway-destination-endpoint"
PICK = f"{A},{B}"
GET_MODELS = {":method": "GET", ":path": "/v1/models", ":authority": "gw"}


def assert_decision(reply, *, mutated: bool = True) -> None:  # type: ignore[no-untyped-def]
    """The reply carries the pick as header (OVERWRITE) and ``envoy.lb`` metadata, or carries nothing."""
    common = getattr(reply, str(reply.WhichOneof("response"))).response
    if not mutated:
        assert not common.header_mutation.set_headers
        assert not reply.HasField("dynamic_metadata")
        return
    assert header_values(common.header_mutation)[DEST] == PICK
    assert all(h.append_action == h.OVERWRITE_IF_EXISTS_OR_ADD for h in common.header_mutation.set_headers)
    assert dict(reply.dynamic_metadata.fields["envoy.lb"].struct_value) == {DEST: PICK}


@pytest.mark.parametrize(
    "mode",
    [None, Mode.NONE, Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED],
    ids=["no-config", "none", "buf", "duplex"],
)
async def test_header_only_request_passes_through_untouched(mode: int | None) -> None:
    handler = ModelHandler()
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(GET_MODELS, eos=True, mode=mode)])
    assert result.kinds() == ["request_headers"]
    assert_decision(result.replies[0], mutated=False)
    assert result.code == grpc.StatusCode.OK  # the server ended the stream itself


async def test_mode_none_decides_on_headers_without_body() -> None:
    handler = FixedHandler()
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(mode=Mode.NONE)])
    assert result.kinds() == ["request_headers"]
    assert_decision(result.replies[0])
    assert header_values(result.replies[0].request_headers.response.header_mutation)["x-router-reason"] == "cache"
    assert handler.seen[0].body == b"" and handler.seen[0].method == "POST"


@pytest.mark.parametrize("mode", [Mode.BUFFERED, None], ids=["buffered", "no-protocol-config"])
async def test_buffered_answers_headers_empty_then_decides_on_body(mode: int | None) -> None:
    handler = FixedHandler()
    body = chat_body()
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(mode=mode), body_msg(body, eos=True)])
    assert result.kinds() == ["request_headers", "request_body"]
    assert_decision(result.replies[0], mutated=False)
    assert_decision(result.replies[1])
    assert result.code == grpc.StatusCode.OK
    request = handler.seen[0]
    assert (request.body, request.path, request.request_id) == (body, "/v1/chat/completions", "req-1")
    assert request.headers[":authority"] == "gw" and request.subset is None


@pytest.mark.parametrize(
    ("mode", "events"),
    [(Mode.BUFFERED, ["coming", "route"]), (None, ["coming", "route"]), (Mode.NONE, ["route"]),
     (Mode.FULL_DUPLEX_STREAMED, ["route"])],
    ids=["buffered", "no-protocol-config", "none", "duplex"],
)  # fmt: skip
async def test_a_body_listener_hears_the_body_is_coming_once_before_the_decision(
    mode: int | None, events: list[str]
) -> None:
    # only where the headers are answered before the body is sent is there a round trip to use
    handler = ListeningHandler()
    messages = [headers_msg(mode=mode)]
    if mode != Mode.NONE:  # NONE decides on the headers and ends the call: a body written after it races the end
        messages.append(body_msg(chat_body(), eos=True))
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, messages)
    assert result.code == grpc.StatusCode.OK
    assert handler.events == events


async def test_buffered_accepts_body_over_grpc_default_4mib() -> None:
    handler = FixedHandler()
    body = b"x" * (10 << 20)
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(mode=Mode.BUFFERED), body_msg(body, eos=True)])
    assert result.kinds() == ["request_headers", "request_body"]
    assert_decision(result.replies[1])
    assert len(handler.seen[0].body) == len(body)


def _echo(result) -> bytes:  # type: ignore[no-untyped-def]
    return b"".join(r.request_body.response.body_mutation.streamed_response.body for r in result.replies[1:])


@pytest.mark.parametrize("size", [0, 1, 61_999, 62_000, 62_001, 300_123], ids=lambda n: f"{n}B")
async def test_full_duplex_holds_headers_until_body_ends_then_echoes(size: int) -> None:
    handler = FixedHandler()
    body = bytes(i % 251 for i in range(size))
    messages = [headers_msg(mode=Mode.FULL_DUPLEX_STREAMED), *chunks(body, 70_000)]
    if not body:
        messages.append(body_msg(b"", eos=True))
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, messages, gap_s=0.01)
    assert set(result.written_at) == {len(messages)}, "a reply came before the body ended"
    assert result.kinds()[0] == "request_headers" and set(result.kinds()[1:]) == {"request_body"}
    assert_decision(result.replies[0])
    streamed = [r.request_body.response.body_mutation.streamed_response for r in result.replies[1:]]
    assert all(len(s.body) <= 62_000 for s in streamed)
    assert [s.end_of_stream for s in streamed] == [False] * (len(streamed) - 1) + [True]
    assert _echo(result) == body == handler.seen[0].body
    assert result.code == grpc.StatusCode.OK


async def test_full_duplex_body_ended_by_trailers() -> None:
    handler = FixedHandler()
    body = b"y" * 130_000
    messages = [headers_msg(mode=Mode.FULL_DUPLEX_STREAMED), body_msg(body, eos=False), trailers_msg()]
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, messages, gap_s=0.01)
    assert set(result.written_at) == {3}
    assert result.kinds() == ["request_headers"] + ["request_body"] * 3 + ["request_trailers"]
    assert _echo_until_trailers(result) == body
    streamed = [r.request_body.response.body_mutation.streamed_response for r in result.replies[1:4]]
    assert not any(s.end_of_stream for s in streamed)  # the trailers, not the body, end the stream


def _echo_until_trailers(result) -> bytes:  # type: ignore[no-untyped-def]
    parts = result.replies[1:-1]
    return b"".join(r.request_body.response.body_mutation.streamed_response.body for r in parts)


@pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED], ids=["buffered", "duplex"])
async def test_pass_through_answer_has_no_mutation(mode: int) -> None:
    handler = FixedHandler(answer=PassThrough())
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(mode=mode), body_msg(chat_body(), eos=True)])
    assert all(not r.HasField("dynamic_metadata") for r in result.replies)
    assert_decision(result.replies[-1] if mode == Mode.BUFFERED else result.replies[0], mutated=False)


async def test_route_with_no_endpoints_is_pass_through() -> None:
    handler = FixedHandler(answer=Route(()))
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(mode=Mode.BUFFERED), body_msg(chat_body(), eos=True)])
    assert_decision(result.replies[1], mutated=False)


async def test_request_without_request_id_gets_a_generated_one() -> None:
    handler = FixedHandler()
    headers = {k: v for k, v in CHAT_HEADERS.items() if k != "x-request-id"}
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        for _ in range(2):
            await run_exchange(stub, [headers_msg(headers, eos=True)])
    ids = [r.request_id for r in handler.seen]
    assert len(ids) == 2 and all(len(i) >= 16 for i in ids) and ids[0] != ids[1]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"\xff\xfeabc", "\ufffd\ufffdabc"), ("héllo".encode(), "héllo")],
    ids=["invalid-utf8", "utf8"],
)
async def test_header_bytes_are_decoded_without_crashing(raw: bytes, expected: str) -> None:
    handler = FixedHandler()
    msg = headers_msg(eos=True)
    msg.request_headers.headers.headers.add(key="X-Tenant", raw_value=raw)
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [msg])
    assert result.code == grpc.StatusCode.OK
    assert handler.seen[0].headers["x-tenant"] == expected


async def test_close_after_pick_off_serves_response_path_and_reports_served() -> None:
    handler = ModelHandler()
    served_md = {"envoy.lb": {"x-gateway-destination-endpoint-served": str(B)}}
    response_headers = pb.ProcessingRequest(response_headers=pb.HttpHeaders(), metadata_context=metadata(served_md))
    messages = [headers_msg(mode=Mode.BUFFERED), body_msg(chat_body(), eos=True), response_headers]
    async with serving(handler, ProcessorOptions(close_after_pick=False)) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, messages, gap_s=0.01)
    assert result.kinds() == ["request_headers", "request_body", "response_headers"]
    assert handler.served == [("req-1", B)]
    assert result.code == grpc.StatusCode.OK
