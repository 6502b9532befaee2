"""End to end through a real Envoy 1.40: our stubs and servicer work on the wire, in both body modes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from extproc.errors import UnknownModel
from extproc.protocol import ProcessorOptions
from extproc.protocol.server import start_ext_proc
from extproc.types import EndpointId, HttpRequest, PassThrough, Route
from tests.protocol import extproc_wire
from tests.protocol.extproc_envoy_stack import envoy, upstreams

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.usefixtures("each_grpc_server")]


class ByModel:
    """Routes model ``m<i>`` to upstream ``i`` (fallback: the others); GETs pass through."""

    def __init__(self, ports: list[int]) -> None:
        self.ends = [EndpointId(f"127.0.0.1:{p}") for p in ports]

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        if request.method == "GET":
            return PassThrough()
        model = json.loads(request.body)["model"]
        if model not in ("m0", "m1"):
            raise UnknownModel(f"The model '{model}' does not exist.", param="model")
        i = int(model[1])
        return Route((self.ends[i], self.ends[1 - i]), {"x-router-reason": "cache"})


class ServedByModel(ByModel):
    """Also records which endpoint Envoy says served each request (the GIE "served" feedback)."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__(ports)
        self.served: list[tuple[str, EndpointId]] = []

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        self.served.append((request_id, endpoint))


@pytest.fixture(params=["BUFFERED", "FULL_DUPLEX_STREAMED"], ids=["buffered", "duplex"])
async def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, list[int]]]:
    async with upstreams(2) as ports:
        server = await start_ext_proc(ByModel(ports), kind=extproc_wire.server_kind, host="127.0.0.1", port=0)
        try:
            async with envoy(tmp_path, server.port, ports, request.param) as url:
                yield url, ports
        finally:
            await server.stop(grace_s=None)


@pytest.mark.parametrize("size", [100, 5 << 20], ids=["small", "5MiB"])
async def test_body_routes_by_model_and_reaches_upstream_intact(gateway: tuple[str, list[int]], size: int) -> None:
    url, ports = gateway
    async with aiohttp.ClientSession() as http:
        for i in (1, 0, 1):
            body = json.dumps({"model": f"m{i}", "messages": [{"role": "user", "content": "x" * size}]}).encode()
            headers = {"content-type": "application/json"}
            async with http.post(f"{url}/v1/chat/completions", data=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                seen = await resp.json()
            assert seen["port"] == ports[i]
            assert (seen["len"], seen["sha"]) == (len(body), hashlib.sha256(body).hexdigest())
            assert seen["dest"] == f"127.0.0.1:{ports[i]},127.0.0.1:{ports[1 - i]}"
            assert seen["reason"] == "cache"


async def test_refusal_reaches_client_as_openai_error(gateway: tuple[str, list[int]]) -> None:
    url, _ = gateway
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json={"model": "nope", "messages": []}) as resp:
            assert resp.status == 404
            assert resp.headers["content-type"] == "application/json"
            assert (await resp.json())["error"]["code"] == "model_not_found"
        async with http.get(f"{url}/v1/models") as resp:  # next request unaffected; GET passes through
            assert resp.status == 200
            assert (await resp.json())["dest"] is None


@pytest.mark.parametrize("mode", ["BUFFERED", "FULL_DUPLEX_STREAMED"], ids=["buffered", "duplex"])
async def test_served_endpoint_feedback_with_stream_kept_open(mode: str, tmp_path: Path) -> None:
    async with upstreams(2) as ports:
        handler = ServedByModel(ports)
        options = ProcessorOptions(close_after_pick=False)
        server = await start_ext_proc(handler, kind=extproc_wire.server_kind, host="127.0.0.1", port=0, options=options)
        try:
            async with (
                envoy(tmp_path, server.port, ports, mode, response_headers=True) as url,
                aiohttp.ClientSession() as http,
            ):
                body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
                headers = {"x-request-id": "req-served"}
                async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["port"] == ports[1]
        finally:
            await server.stop(grace_s=None)
    assert handler.served == [("req-served", EndpointId(f"127.0.0.1:{ports[1]}"))]
