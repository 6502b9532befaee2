"""Hermetic: odd message sequences and many concurrent streams never crash or hang the server."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from extproc.protocol import ProcessorOptions
from extproc.protocol.pb import external_processor_pb2_grpc
from tests.protocol.extproc_fakes import A, B, FixedHandler
from tests.protocol.extproc_wire import (
    Mode,
    body_msg,
    chat_body,
    chunks,
    headers_msg,
    pb,
    run_exchange,
    serving,
    trailers_msg,
)

pytestmark = pytest.mark.usefixtures("each_grpc_server")  # every test once per gRPC stack

PICK = f"{A},{B}"


def lb_value(reply: pb.ProcessingResponse) -> str:
    return reply.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value


async def test_buffered_request_ended_by_trailers_carries_pick_in_metadata() -> None:
    async with serving(FixedHandler()) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, [headers_msg(mode=Mode.BUFFERED), trailers_msg()], gap_s=0.01)
    assert result.kinds() == ["request_headers", "request_trailers"]
    assert lb_value(result.replies[1]) == PICK


SEQUENCES = {
    "empty-message-first": [pb.ProcessingRequest(), headers_msg(eos=True)],
    "body-before-headers": [body_msg(chat_body(), eos=True)],
    "response-headers-only": [pb.ProcessingRequest(response_headers=pb.HttpHeaders())],
}


@pytest.mark.parametrize("name", list(SEQUENCES))
async def test_odd_sequences_end_cleanly(name: str) -> None:
    handler = FixedHandler()
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, SEQUENCES[name], timeout_s=5)
        after = await run_exchange(stub, [headers_msg(eos=True)])
    assert result.code == grpc.StatusCode.OK
    assert after.kinds() == ["request_headers"] and lb_value(after.replies[0]) == PICK


async def test_many_concurrent_streams_in_mixed_modes() -> None:
    rng = random.Random(7)
    modes = [Mode.NONE, Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED]
    plans = []
    for i in range(60):
        mode = modes[i % 3]
        body = chat_body(text="x" * rng.randrange(0, 150_000))
        size = rng.randrange(1_000, 80_000) if mode == Mode.FULL_DUPLEX_STREAMED else len(body)
        # Body mode NONE: Envoy sends the headers alone, and the server ends the call at once. (Writing the body
        # anyway raced that end: a grpc.aio write in flight when the server's OK trailers arrive fails and
        # marks the call INTERNAL on the client's side; seen under CPU load, on either stack.)
        body_msgs = chunks(body, size) if mode != Mode.NONE else []
        plans.append((mode, body, [headers_msg(mode=mode), *body_msgs]))
    handler = FixedHandler()
    async with serving(handler) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        runs = (run_exchange(stub, messages) for _, _, messages in plans)
        results = await asyncio.wait_for(asyncio.gather(*runs), timeout=60)
    assert len(handler.seen) == len(plans)
    for (mode, body, _), result in zip(plans, results, strict=True):
        assert result.code == grpc.StatusCode.OK
        decision_at = 1 if mode == Mode.BUFFERED else 0
        assert lb_value(result.replies[decision_at]) == PICK
        if mode == Mode.FULL_DUPLEX_STREAMED:
            echoed = b"".join(r.request_body.response.body_mutation.streamed_response.body for r in result.replies[1:])
            assert echoed == body


@pytest.mark.parametrize("response_mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED], ids=["buffered", "duplex"])
async def test_response_path_when_stream_is_kept_open(response_mode: int) -> None:
    first = headers_msg(mode=Mode.BUFFERED)
    first.protocol_config.response_body_mode = response_mode  # type: ignore[assignment]
    response = [
        pb.ProcessingRequest(response_headers=pb.HttpHeaders()),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: 1\n\n", end_of_stream=False)),
        pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: 2\n\n", end_of_stream=True)),
        pb.ProcessingRequest(response_trailers=pb.HttpTrailers()),
    ]
    messages = [first, body_msg(chat_body(), eos=True), *response]
    async with serving(FixedHandler(), ProcessorOptions(close_after_pick=False)) as (_, channel):
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        result = await run_exchange(stub, messages, gap_s=0.005)
    assert result.kinds() == [
        "request_headers",
        "request_body",
        "response_headers",
        *["response_body"] * 2,
        "response_trailers",
    ]
    streamed = [r.response_body.response.body_mutation.streamed_response for r in result.replies[3:5]]
    if response_mode == Mode.FULL_DUPLEX_STREAMED:  # echoed as it comes, end_of_stream kept
        assert [(s.body, s.end_of_stream) for s in streamed] == [
            (b"data: 1\n\n", False),
            (b"data: 2\n\n", True),
        ]
    else:
        assert all(not r.response_body.HasField("response") for r in result.replies[3:5])
    assert result.code == grpc.StatusCode.OK
