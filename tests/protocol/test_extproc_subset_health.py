"""Hermetic: the subset hint reaches the router; gRPC health answers for the names gateways probe."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.protocol.pb import external_processor_pb2_grpc
from tests.protocol.extproc_fakes import A, B, C, FixedHandler, ModelHandler
from tests.protocol.extproc_wire import (
    Mode,
    body_msg,
    chat_body,
    error_json,
    headers_msg,
    metadata,
    run_exchange,
    serving,
)

pytestmark = pytest.mark.usefixtures("each_grpc_server")  # every test once per gRPC stack

HINT_NS, HINT_KEY = "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset"


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        ([str(B), str(C)], (B, C)),
        (f"{B}, {C}", (B, C)),
        (str(C), (C,)),
        ([f"{A},{B}", str(C)], (A, B, C)),
        ([], ()),
        ("", ()),
    ],
    ids=["list", "comma-string", "single", "list-of-comma-strings", "empty-list", "empty-string"],
)
@pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED], ids=["buffered", "duplex"])
async def test_subset_hint_reaches_the_handler(mode: int, hint: object, expected: tuple[str, ...]) -> None:
    handler = FixedHandler()
    messages = [headers_msg(mode=mode, subset=hint), body_msg(chat_body(), eos=True)]
    async with serving(handler) as (_, channel):
        await run_exchange(external_processor_pb2_grpc.ExternalProcessorStub(channel), messages)
    assert handler.seen[0].subset == expected


async def test_subset_hint_on_the_body_message() -> None:
    handler = FixedHandler()
    body = body_msg(chat_body(), eos=True)
    body.metadata_context.CopyFrom(metadata({HINT_NS: {HINT_KEY: [str(C)]}}))
    messages = [headers_msg(mode=Mode.FULL_DUPLEX_STREAMED), body]
    async with serving(handler) as (_, channel):
        await run_exchange(external_processor_pb2_grpc.ExternalProcessorStub(channel), messages)
    assert handler.seen[0].subset == (C,)


async def test_no_hint_means_no_subset() -> None:
    handler = FixedHandler()
    msg = headers_msg(eos=True)
    msg.metadata_context.CopyFrom(metadata({"other.namespace": {"k": "v"}}))
    async with serving(handler) as (_, channel):
        await run_exchange(external_processor_pb2_grpc.ExternalProcessorStub(channel), [msg])
    assert handler.seen[0].subset is None


@pytest.mark.parametrize(
    ("hint", "status", "pick"),
    [
        ([str(C)], 0, str(C)),
        ([str(B), "10.9.9.9:1"], 0, str(B)),
        (["10.9.9.9:1"], 503, None),
        ([], 503, None),
    ],
    ids=["one-eligible", "one-of-two-eligible", "none-eligible", "empty"],
)
async def test_router_honours_subset_or_answers_503(hint: list[str], status: int, pick: str | None) -> None:
    messages = [headers_msg(mode=Mode.FULL_DUPLEX_STREAMED, subset=hint), body_msg(chat_body(), eos=True)]
    async with serving(ModelHandler()) as (_, channel):
        result = await run_exchange(external_processor_pb2_grpc.ExternalProcessorStub(channel), messages)
    first = result.replies[0]
    if status:
        assert first.immediate_response.status.code == status
        assert error_json(first)["error"]["code"] == "no_endpoint_available"
    else:
        lb = first.dynamic_metadata.fields["envoy.lb"].struct_value
        assert lb.fields["x-gateway-destination-endpoint"].string_value == pick


SERVICES = ["", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(channel: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return reply.status  # type: ignore[no-any-return]


@pytest.mark.parametrize("service", SERVICES, ids=["overall", "liveness", "readiness", "ext_proc"])
async def test_health_serving(service: str) -> None:
    async with serving(FixedHandler()) as (_, channel):
        assert await _status(channel, service) == SERVING


async def test_readiness_follows_the_app() -> None:
    async with serving(FixedHandler(), ready=False) as (server, channel):
        assert await _status(channel, "readiness") == NOT_SERVING
        assert await _status(channel, "liveness") == SERVING
        await server.set_ready(True)
        assert await _status(channel, "readiness") == SERVING
        await server.set_ready(False)
        assert await _status(channel, "readiness") == NOT_SERVING


async def test_unknown_health_service_is_not_found() -> None:
    async with serving(FixedHandler()) as (_, channel):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _status(channel, "no.such.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
