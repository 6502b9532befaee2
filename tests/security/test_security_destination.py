"""A client cannot choose a backend: forged ``x-gateway-destination-endpoint`` headers, forged ``envoy.lb``
metadata and forged subset hints never make the router target anything but configured endpoints.

In process (the real router behind the real ext_proc exchange) and end to end (real Envoy, the picker
process, simulators, plus an "attacker" backend that no config names and that must never see a request,
whether the picker is up or down). The picker's log is checked for the prompt text as well: none.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import pytest_asyncio

from bench.stack_config import MODEL
from extproc import wire
from extproc.app import App
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.errors import NoEndpoint
from extproc.protocol import ProcessorOptions
from extproc.protocol.exchange import Exchange
from extproc.protocol.pb import core_pb2, external_processor_pb2
from extproc.types import EndpointId, HttpRequest, Route
from tests.fuzz.inproc import ready_app
from tests.support.config import ENDPOINTS
from tests.support.envoy import EchoBackend
from tests.support.stacks import StackFactory

pb = external_processor_pb2
A, B, C = (EndpointId(e) for e in ENDPOINTS)
FOREIGN = "10.66.66.66:6666"
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Which backend am I on?"}]}).encode()


IN_PROCESS = pytest.mark.asyncio(loop_scope="module")  # the tests sharing ``app`` run on its loop


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app():  # type: ignore[no-untyped-def]
    """One in-process router for this module's in-process tests (loading its tokenizer is most of a test's
    time). What they route adds load on A and B only, and C stays far the busiest, so their order is free."""
    app = await ready_app()
    busy = EngineMetrics(running=40, waiting=60, kv_usage=0.95, models=frozenset({MODEL}))
    app.registry.scraped(C, busy)  # C is the one a forger would pick for a free ride: it is the worst choice
    yield app
    await app.stop()


def request(headers: dict[str, str], subset: tuple[EndpointId, ...] | None = None) -> HttpRequest:
    base = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    return HttpRequest("POST", "/v1/chat/completions", {**base, **headers}, BODY, "r", subset)


@pytest.mark.parametrize("forged", [FOREIGN, f"{FOREIGN},{A}", str(C), f"{C},{FOREIGN}"])
@IN_PROCESS
async def test_forged_destination_header_is_ignored(app: App, forged: str) -> None:
    for _ in range(10):
        route = await app.router.route(request({wire.DESTINATION_HEADER: forged}))
        assert isinstance(route, Route)
        assert set(route.endpoints) <= {A, B, C}
        assert route.endpoints[0] != C, "the forged header must not win over load"


@IN_PROCESS
async def test_forged_subset_hint_never_targets_unconfigured_endpoints(app: App) -> None:
    with pytest.raises(NoEndpoint):
        await app.router.route(request({}, subset=(EndpointId(FOREIGN),)))
    route = await app.router.route(request({}, subset=(EndpointId(FOREIGN), B)))
    assert isinstance(route, Route) and route.endpoints == (B,)


def headers_message(extra: dict[str, str], md: core_pb2.Metadata) -> pb.ProcessingRequest:
    values = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json", **extra}
    hv = [core_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
    msg = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=core_pb2.HeaderMap(headers=hv)))
    msg.metadata_context.CopyFrom(md)
    return msg


@IN_PROCESS
async def test_forged_lb_metadata_in_the_request_is_ignored(app: App) -> None:
    md = core_pb2.Metadata()
    md.filter_metadata[wire.LB_NAMESPACE].update(
        {wire.DESTINATION_METADATA_KEY: FOREIGN, wire.SERVED_METADATA_KEY: FOREIGN}
    )
    exchange = Exchange(app.router, ProcessorOptions())
    assert len(await exchange.receive(headers_message({wire.DESTINATION_HEADER: FOREIGN}, md))) == 1
    replies = await exchange.receive(pb.ProcessingRequest(request_body=pb.HttpBody(body=BODY, end_of_stream=True)))
    (reply,) = replies
    lb = (
        reply.dynamic_metadata.fields[wire.LB_NAMESPACE].struct_value.fields[wire.DESTINATION_METADATA_KEY].string_value
    )
    header = {
        h.header.key: h.header.raw_value.decode() for h in reply.request_body.response.header_mutation.set_headers
    }
    assert header[wire.DESTINATION_HEADER] == lb
    assert set(lb.split(",")) <= {A, B, C} and FOREIGN not in lb


# -- end to end: real Envoy, the picker process, simulators, and an attacker's backend ------------------------

SECRET = "zebra-octopus-7731"  # prompt text that must not reach the picker's log


async def send_forged(url: str, forged: str, n: int) -> list[int]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{SECRET} question"}], "max_tokens": 2}
    async with aiohttp.ClientSession() as session:

        async def one() -> int:
            async with session.post(url, json=body, headers={wire.DESTINATION_HEADER: forged}) as resp:
                await resp.read()
                return resp.status

        return list(await asyncio.gather(*(one() for _ in range(n))))


@pytest.mark.envoy
@pytest.mark.slow
async def test_forged_header_through_envoy_never_reaches_an_unconfigured_host(make_stack: StackFactory) -> None:
    async with EchoBackend() as attacker:
        stack = make_stack(2)
        url = stack.envoy.url("/v1/chat/completions")
        assert await send_forged(url, attacker.endpoint, 8) == [200] * 8
        assert await send_forged(url, f"{attacker.endpoint},{stack.backends[0]}", 4) == [200] * 4
        log = stack.envoy.wait_for_access_log(12)
        assert all(e.upstream in stack.backends for e in log)
        assert all(attacker.endpoint not in e.dest for e in log)
        assert stack.picker is not None
        assert SECRET not in stack.picker.log_text(), "prompt text must not be logged by default"
        # The picker down (fail-open): the strip filter removes the header before ext_proc, and override_host
        # ignores hosts outside the cluster, so the round-robin fallback serves every request.
        stack.picker.stop()
        assert await send_forged(url, attacker.endpoint, 6) == [200] * 6
        hosts = [e.upstream for e in stack.envoy.wait_for_access_log(18)[12:]]
        assert set(hosts) == set(stack.backends)
        assert attacker.requests == 0


@pytest.mark.envoy
@pytest.mark.slow
async def test_forged_header_naming_a_real_backend_does_not_pin_it_when_the_picker_is_down(
    make_stack: StackFactory,
) -> None:
    stack = make_stack(2)
    assert stack.picker is not None
    stack.picker.stop()
    url = stack.envoy.url("/v1/chat/completions")
    for _ in range(6):  # sequential: the round robin alternates, a honoured header would pin backend 0
        assert await send_forged(url, stack.backends[0], 1) == [200]
    hosts = [e.upstream for e in stack.envoy.wait_for_access_log(6)]
    assert set(hosts) == set(stack.backends)
    assert all(not e.dest for e in stack.envoy.wait_for_access_log(6)), "the forged header was stripped"
