"""Real Envoy with ``transport: ext_authz`` (the rendered bootstrap), asking our ext_authz server
(``extproc.authz``): with a scripted handler, what the bootstrap must get right (the pick beats a forged header and
arrives with its summary, the body and the headers the picker reads reach it, a refusal reaches the client, a
bypass route and a dead picker still serve); then the real picker on simulators, end to end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from extproc import wire
from extproc.authz import start_authz_server
from extproc.errors import RouterError
from extproc.types import EndpointId, HttpRequest, PassThrough, Route
from tests.support.envoy import EchoBackend, EnvoyFactory
from tests.support.ports import free_port
from tests.support.stacks import GieStackFactory

pytestmark = pytest.mark.envoy
PORT = EchoBackend.PORT_HEADER
BODY = b'{"model": "m", "prompt": "hi"}'


@dataclass
class Scripted:
    """Routes every request to ``pick()`` (or raises ``refuse``); records what it was shown."""

    pick: Callable[[], tuple[str, ...]]
    refuse: RouterError | None = None
    seen: list[HttpRequest] = field(default_factory=list)

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        self.seen.append(request)
        if self.refuse is not None:
            raise self.refuse
        return Route(tuple(EndpointId(e) for e in self.pick()), {wire.REASON_HEADER: "scripted"})


StartAuthz = Callable[[Scripted], Awaitable[int]]


@pytest.fixture
async def authz_server() -> AsyncIterator[StartAuthz]:
    servers: list[asyncio.Server] = []

    async def start(handler: Scripted) -> int:
        servers.append(await start_authz_server(handler))
        return int(servers[-1].sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def _post(session: aiohttp.ClientSession, url: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    async with session.post(url, data=BODY, headers={"content-type": "application/json", **headers}) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, await resp.read()


async def test_the_pick_beats_a_forged_header_and_the_picker_sees_what_it_reads(
    envoy_factory: EnvoyFactory, authz_server: StartAuthz
) -> None:
    async with EchoBackend() as a, EchoBackend() as b:
        handler = Scripted(pick=lambda: (b.endpoint,))
        port = await authz_server(handler)
        envoy = envoy_factory([a.endpoint, b.endpoint], picker_port=port, transport="ext_authz")
        async with aiohttp.ClientSession() as session:
            forged = {wire.DESTINATION_HEADER: a.endpoint, wire.TENANT_HEADER: "acme", "x-secret": "s"}
            answers = [await _post(session, envoy.url("/v1/completions?x=1"), **forged) for _ in range(3)]

    assert [(status, headers[PORT]) for status, headers, _ in answers] == [(200, str(b.port))] * 3
    seen = handler.seen[0]
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/completions?x=1", BODY)
    assert seen.headers["content-type"] == "application/json" and seen.headers[wire.TENANT_HEADER] == "acme"
    assert wire.DESTINATION_HEADER not in seen.headers  # stripped before the check
    assert "x-secret" not in seen.headers and seen.request_id  # only what the picker reads; Envoy's request id
    log = envoy.wait_for_access_log(3)
    assert {(e.upstream, e.dest, e.reason) for e in log} == {(b.endpoint, b.endpoint, "scripted")}


async def test_a_refusal_reaches_the_client_as_the_pickers_json_error(
    envoy_factory: EnvoyFactory, authz_server: StartAuthz
) -> None:
    async with EchoBackend() as a:
        port = await authz_server(Scripted(pick=lambda: (a.endpoint,), refuse=RouterError("bad body", param="x")))
        envoy = envoy_factory([a.endpoint], picker_port=port, transport="ext_authz")
        async with aiohttp.ClientSession() as session:
            status, headers, body = await _post(session, envoy.url("/v1/completions"))
        assert a.requests == 0

    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["message"] == "bad body"


async def test_a_dead_picker_fails_open_and_a_bypass_route_never_asks(
    envoy_factory: EnvoyFactory, authz_server: StartAuthz
) -> None:
    async with EchoBackend() as a:
        handler = Scripted(pick=lambda: (a.endpoint,))
        port = await authz_server(handler)
        envoy = envoy_factory(
            [a.endpoint], picker_port=port, transport="ext_authz", picker_bypass_prefixes=("/health",)
        )
        dead = envoy_factory([a.endpoint], picker_port=free_port(), transport="ext_authz")
        async with aiohttp.ClientSession() as session:
            bypassed = await _post(session, envoy.url("/health"))
            failed_open = await _post(session, dead.url("/v1/completions"))

    assert bypassed[0] == 200 and handler.seen == []
    assert failed_open[0] == 200 and failed_open[1][PORT] == str(a.port)
    assert dead.wait_for_access_log(1)[0].dest == ""


@pytest.mark.parametrize("fronts", [0, 1], ids=["one-process", "with-a-front-worker"])
async def test_the_real_picker_routes_over_ext_authz(gie_stack: GieStackFactory, fronts: int) -> None:
    stack = gie_stack({"transport": "ext_authz"}, {"workers": {"fronts": fronts}}, backends=2)
    body = json.dumps({"model": "Qwen/Qwen3-0.6B", "messages": [{"role": "user", "content": "hello " * 40}],
                       "max_tokens": 1}).encode()  # fmt: skip
    async with aiohttp.ClientSession() as session:
        for _ in range(4):
            async with session.post(stack.url + "/v1/chat/completions", data=body,
                                    headers={"content-type": "application/json"}) as resp:  # fmt: skip
                assert resp.status == 200, await resp.text()
                await resp.read()
    log = stack.envoy.wait_for_access_log(4)
    assert all(e.dest and e.upstream == e.dest.split(",")[0] and e.reason for e in log), log
