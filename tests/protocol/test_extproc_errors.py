"""Hermetic: refusals become OpenAI-style ImmediateResponses; handler failures fail open."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from extproc.errors import (
    BadRequest,
    BodyTooLarge,
    NoEndpoint,
    Overloaded,
    RouterError,
    UnknownModel,
    UnsupportedMediaType,
)
from extproc.protocol import ProcessorOptions
from extproc.protocol.pb import external_processor_pb2_grpc
from tests.protocol.extproc_fakes import FixedHandler, GatedHandler, ModelHandler
from tests.protocol.extproc_wire import (
    CHAT_HEADERS,
    Mode,
    body_msg,
    chat_body,
    chunks,
    error_json,
    header_values,
    headers_msg,
    run_exchange,
    serving,
)

pytestmark = pytest.mark.usefixtures("each_grpc_server")  # every test once per gRPC stack

MODES = pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED], ids=["buffered", "duplex"])


def stub_for(channel: grpc.aio.Channel) -> external_processor_pb2_grpc.ExternalProcessorStub:
    return external_processor_pb2_grpc.ExternalProcessorStub(channel)


def assert_refused(result, status: int, code: str, *, error_type: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    """One ImmediateResponse with ``status`` and an OpenAI error body, and a cleanly ended stream."""
    assert result.kinds()[-1] == "immediate_response"
    assert "request_body" not in result.kinds()  # no body echo after a refusal
    immediate = result.replies[-1].immediate_response
    assert immediate.status.code == status
    assert header_values(immediate.headers)["content-type"] == "application/json"
    error = error_json(result.replies[-1])["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code and error["message"]
    if error_type is not None:
        assert error["type"] == error_type
    assert result.code == grpc.StatusCode.OK
    return error


ROUTER_ERRORS = [
    (BadRequest("bad", param="messages"), 400, "invalid_request_error"),
    (UnknownModel("no such model", param="model"), 404, "invalid_request_error"),
    (BodyTooLarge("too big"), 413, "invalid_request_error"),
    (UnsupportedMediaType("json only"), 415, "invalid_request_error"),
    (Overloaded("shedding"), 429, "rate_limit_error"),
    (NoEndpoint("nothing ready"), 503, "server_error"),
]


@MODES
@pytest.mark.parametrize(("error", "status", "etype"), ROUTER_ERRORS, ids=lambda v: getattr(v, "code", None))
async def test_router_error_becomes_immediate_response(mode: int, error: RouterError, status: int, etype: str) -> None:
    async with serving(FixedHandler(error=error)) as (_, channel):
        result = await run_exchange(stub_for(channel), [headers_msg(mode=mode), body_msg(chat_body(), eos=True)])
    body = assert_refused(result, status, error.code, error_type=etype)
    assert body["param"] == error.param and body["message"] == error.message


async def test_router_error_on_header_only_request() -> None:
    async with serving(FixedHandler(error=Overloaded("shed"))) as (_, channel):
        result = await run_exchange(stub_for(channel), [headers_msg(eos=True, mode=Mode.NONE)])
    assert result.kinds() == ["immediate_response"]
    assert_refused(result, 429, "overloaded")


def body_messages(mode: int, body: bytes) -> list:  # type: ignore[type-arg]
    """One body message (BUFFERED) or small chunks (FULL_DUPLEX_STREAMED)."""
    return chunks(body, 7) if mode == Mode.FULL_DUPLEX_STREAMED else [body_msg(body, eos=True)]


JSON_HEADERS = dict(CHAT_HEADERS)
TEXT_HEADERS = {**CHAT_HEADERS, "content-type": "text/plain"}
BAD_INPUT = [
    pytest.param(JSON_HEADERS, b"{not json", 400, None, id="not-json"),
    pytest.param(JSON_HEADERS, b"[1, 2]", 400, None, id="not-an-object"),
    pytest.param(TEXT_HEADERS, chat_body(), 415, None, id="wrong-content-type"),
    pytest.param(JSON_HEADERS, b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model", id="no-model"),
    pytest.param(JSON_HEADERS, chat_body(model="nope"), 404, "model", id="unknown-model"),
    pytest.param(JSON_HEADERS, b'{"model": "m", "messages": []}', 400, "messages", id="empty-messages"),
    pytest.param(JSON_HEADERS, b'{"model": "m", "messages": "\xff\xfe"}', 400, None, id="invalid-utf8"),
]


@MODES
@pytest.mark.parametrize(("headers", "body", "status", "param"), BAD_INPUT)
async def test_bad_input_is_refused_and_next_request_unaffected(
    mode: int, headers: dict[str, str], body: bytes, status: int, param: str | None
) -> None:
    async with serving(ModelHandler()) as (_, channel):
        stub = stub_for(channel)
        bad = await run_exchange(stub, [headers_msg(headers, mode=mode), *body_messages(mode, body)])
        good = await run_exchange(stub, [headers_msg(mode=mode), *body_messages(mode, chat_body())])
    assert assert_refused(bad, status, bad.replies[-1].immediate_response.details[len("extproc_") :])["param"] == param
    assert "immediate_response" not in good.kinds() and good.code == grpc.StatusCode.OK


@pytest.mark.parametrize("mode", [Mode.FULL_DUPLEX_STREAMED, Mode.BUFFERED], ids=["duplex", "buffered"])
async def test_body_over_max_body_bytes_gets_413(mode: int) -> None:
    handler = FixedHandler()
    body = b"z" * 240_000
    chunk_size = 60_000 if mode == Mode.FULL_DUPLEX_STREAMED else len(body)
    messages = [headers_msg(mode=mode), *chunks(body, chunk_size)]
    async with serving(handler, ProcessorOptions(max_body_bytes=100_000)) as (_, channel):
        result = await run_exchange(stub_for(channel), messages, gap_s=0.01)
    assert_refused(result, 413, "request_too_large")
    assert handler.seen == []  # refused before the router was asked
    if mode == Mode.FULL_DUPLEX_STREAMED:
        assert result.kinds() == ["immediate_response"]
        assert result.written_at == [3]  # answered as soon as the second chunk crossed the cap


class Boom(Exception):
    pass


@MODES
@pytest.mark.parametrize("error", [Boom("bug"), KeyError("x"), TimeoutError()], ids=["boom", "key", "timeout"])
async def test_unexpected_handler_exception_fails_open(mode: int, error: Exception) -> None:
    body = chat_body()
    async with serving(FixedHandler(error=error)) as (_, channel):
        result = await run_exchange(stub_for(channel), [headers_msg(mode=mode), body_msg(body, eos=True)])
    assert "immediate_response" not in result.kinds() and result.code == grpc.StatusCode.OK
    assert all(not r.HasField("dynamic_metadata") for r in result.replies)
    if mode == Mode.FULL_DUPLEX_STREAMED:  # the body must still reach the upstream
        echoed = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in result.replies[1:])
        assert echoed == body
    else:
        assert result.kinds() == ["request_headers", "request_body"]


async def test_handler_slower_than_route_timeout_fails_open() -> None:
    handler = GatedHandler()  # never opens the gate
    slow = {**CHAT_HEADERS, "x-slow": "1"}
    async with serving(handler, ProcessorOptions(route_timeout_s=0.05)) as (_, channel):
        result = await run_exchange(
            stub_for(channel), [headers_msg(slow, mode=Mode.BUFFERED), body_msg(b"{}", eos=True)]
        )
    assert result.kinds() == ["request_headers", "request_body"]
    assert not result.replies[1].request_body.response.header_mutation.set_headers


async def test_slow_handler_does_not_block_other_streams() -> None:
    handler = GatedHandler()
    slow_headers = {**CHAT_HEADERS, "x-slow": "1"}
    async with serving(handler) as (_, channel):
        stub = stub_for(channel)
        slow = asyncio.create_task(run_exchange(stub, [headers_msg(slow_headers, eos=True)]))
        while handler.waiting < 1:
            await asyncio.sleep(0.005)
        fast = await asyncio.wait_for(run_exchange(stub, [headers_msg(eos=True)]), timeout=5)
        assert not slow.done()
        handler.gate.set()
        slow_result = await asyncio.wait_for(slow, timeout=5)
    assert fast.kinds() == ["request_headers"] and slow_result.kinds() == ["request_headers"]
    assert [r.headers.get("x-slow") for r in handler.inner.seen] == [None, "1"]
