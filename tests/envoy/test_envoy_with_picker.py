"""Real Envoy running the rendered bootstrap, calling our real ext_proc server with a scripted handler.

Pins the wiring the bootstrap is responsible for: the picker's pick beats a forged client header, a
fallback list is walked on connect failure, the subset hint reaches the picker, and the served endpoint
comes back on the response path. (Body-mode details of the servicer are tests/protocol's job.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from extproc.protocol import ProcessorOptions, RunningServer, start_server
from extproc.types import EndpointId, HttpRequest, PassThrough, Route
from tests.support.envoy import EchoBackend, EnvoyFactory
from tests.support.ports import free_port

pytestmark = pytest.mark.envoy
StartPicker = Callable[..., Awaitable[RunningServer]]
PORT = EchoBackend.PORT_HEADER


@dataclass
class Scripted:
    """Routes every request to ``pick()``; records what it was shown and what Envoy reports as served."""

    pick: Callable[[], tuple[str, ...]]
    seen: list[HttpRequest] = field(default_factory=list)
    served: list[str] = field(default_factory=list)

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        self.seen.append(request)
        return Route(tuple(EndpointId(e) for e in self.pick()), {"x-router-reason": "scripted"})

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        self.served.append(endpoint)


@pytest.fixture
async def picker_server() -> AsyncIterator[StartPicker]:
    servers: list[RunningServer] = []

    async def start(handler: Scripted, **options: Any) -> RunningServer:
        server = await start_server(handler, host="127.0.0.1", port=0, options=ProcessorOptions(**options))
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop(grace_s=None)


async def _post(session: aiohttp.ClientSession, url: str, **headers: str) -> aiohttp.ClientResponse:
    body = b'{"model": "m", "prompt": "hi"}'
    async with session.post(url, data=body, headers={"content-type": "application/json", **headers}) as resp:
        await resp.read()
        return resp


@pytest.mark.parametrize("body_mode", ["buffered", "full_duplex_streamed"])
async def test_pick_beats_a_forged_client_header(
    envoy_factory: EnvoyFactory, picker_server: StartPicker, body_mode: str
) -> None:
    async with EchoBackend() as a, EchoBackend() as b:
        handler = Scripted(pick=lambda: (b.endpoint,))
        server = await picker_server(handler)
        envoy = envoy_factory([a.endpoint, b.endpoint], picker_port=server.port, body_mode=body_mode)
        async with aiohttp.ClientSession() as session:
            forged = {"x-gateway-destination-endpoint": a.endpoint}
            responses = [await _post(session, envoy.url("/v1/completions"), **forged) for _ in range(3)]

    assert [(r.status, r.headers[PORT]) for r in responses] == [(200, str(b.port))] * 3
    assert all("x-gateway-destination-endpoint" not in r.headers for r in handler.seen)  # stripped first
    log = envoy.wait_for_access_log(3)
    assert {(e.upstream, e.dest, e.reason) for e in log} == {(b.endpoint, b.endpoint, "scripted")}


async def test_fallback_list_is_walked_past_a_dead_pick(
    envoy_factory: EnvoyFactory, picker_server: StartPicker
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with EchoBackend() as alive:
        server = await picker_server(Scripted(pick=lambda: (dead, alive.endpoint)))
        envoy = envoy_factory([dead, alive.endpoint], picker_port=server.port)
        async with aiohttp.ClientSession() as session:
            responses = [await _post(session, envoy.url("/v1/completions")) for _ in range(3)]

    assert [(r.status, r.headers[PORT]) for r in responses] == [(200, str(alive.port))] * 3
    assert [e.attempts for e in envoy.wait_for_access_log(3)] == [2, 2, 2]
    assert envoy.counter("cluster.picked.upstream_rq_retry") == 3


async def test_subset_hint_reaches_picker_and_served_endpoint_comes_back(
    envoy_factory: EnvoyFactory, picker_server: StartPicker
) -> None:
    async with EchoBackend() as a, EchoBackend() as b:
        handler = Scripted(pick=lambda: (b.endpoint,))
        server = await picker_server(handler, close_after_pick=False)
        envoy = envoy_factory(
            [a.endpoint, b.endpoint],
            picker_port=server.port,
            subset_hint=(b.endpoint,),
            send_response_headers=True,
        )
        async with aiohttp.ClientSession() as session:
            resp = await _post(session, envoy.url("/v1/completions"))

    assert (resp.status, resp.headers[PORT]) == (200, str(b.port))
    assert [r.subset for r in handler.seen] == [(b.endpoint,)]
    assert handler.served == [b.endpoint]
