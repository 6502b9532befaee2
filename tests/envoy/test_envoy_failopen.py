"""Real Envoy, no picker: the ext_proc cluster points at a dead port and ``failure_mode_allow`` is on.

What this pins: fail-open really serves (override_host's round-robin fallback), a client cannot pick its
backend (the destination header is stripped before ext_proc), the route's body limit, and retries that
skip a dead host (previous-hosts predicate).
"""

from __future__ import annotations

import aiohttp
import pytest

from tests.support.envoy import EchoBackend, EnvoyFactory, SilentPicker
from tests.support.ports import free_port

pytestmark = pytest.mark.envoy

MIB = 1024 * 1024
PORT = EchoBackend.PORT_HEADER


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes = b"{}", **headers: str
) -> aiohttp.ClientResponse:
    async with session.post(url, data=body, headers={"content-type": "application/json", **headers}) as resp:
        await resp.read()
        return resp


async def test_picker_down_fails_open_round_robin_and_ignores_client_destination(
    envoy_factory: EnvoyFactory,
) -> None:
    async with EchoBackend() as a, EchoBackend() as b:
        envoy = envoy_factory([a.endpoint, b.endpoint])
        forged = {"x-gateway-destination-endpoint": a.endpoint}
        async with aiohttp.ClientSession() as session:
            responses = [await _post(session, envoy.url("/v1/completions"), **forged) for _ in range(6)]

    assert [r.status for r in responses] == [200] * 6
    served = [r.headers[PORT] for r in responses]
    assert set(served) == {str(a.port), str(b.port)}, f"forged header was honoured: {served}"
    log = envoy.wait_for_access_log(6)
    assert all(e.dest == "" for e in log), "the client's x-gateway-destination-endpoint reached the LB"
    assert {e.upstream for e in log} == {a.endpoint, b.endpoint}


@pytest.mark.parametrize(
    ("body_limit_bytes", "expected_status"),
    [(32 * MIB, 200), (1 * MIB, 413)],
    ids=["route-limit-32MiB-accepts", "route-limit-1MiB-rejects"],
)
async def test_route_body_limit_governs_a_10_mib_body(
    envoy_factory: EnvoyFactory, body_limit_bytes: int, expected_status: int
) -> None:
    # The picker hangs (accepts, never answers), so Envoy buffers the body for ext_proc while it waits, and the
    # route's request_body_buffer_limit decides (the 1 MiB row shows the limit is live); after the message
    # timeout ext_proc fails open. (With a refused port instead, Envoy could fail open before buffering.)
    body = b'{"prompt": "' + b"x" * (10 * MIB) + b'"}'
    async with EchoBackend() as backend, SilentPicker() as picker:
        envoy = envoy_factory(
            [backend.endpoint], body_limit_bytes=body_limit_bytes, picker_port=picker.port, message_timeout_s=0.5
        )
        async with aiohttp.ClientSession() as session:
            resp = await _post(session, envoy.url("/v1/chat/completions"), body)

    assert resp.status == expected_status
    if expected_status == 200:
        assert int(resp.headers[EchoBackend.BODY_BYTES_HEADER]) == len(body)


async def test_dead_backend_is_retried_on_another_host(envoy_factory: EnvoyFactory) -> None:
    dead = f"127.0.0.1:{free_port()}"
    async with EchoBackend() as alive:
        envoy = envoy_factory([dead, alive.endpoint])
        async with aiohttp.ClientSession() as session:
            responses = [await _post(session, envoy.url("/v1/completions")) for _ in range(4)]

    assert [r.status for r in responses] == [200] * 4
    assert {r.headers[PORT] for r in responses} == {str(alive.port)}
    assert envoy.counter("cluster.picked.upstream_rq_retry") >= 1
    assert max(e.attempts for e in envoy.wait_for_access_log(4)) == 2
