"""The ext_authz transport (``extproc.authz``) on loopback, with a hand-written handler: what the router sees of
a check request, and what Envoy gets back for each kind of answer, in order, within the limits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from extproc.authz import AuthzOptions, request_of, start_authz_server
from extproc.errors import RouterError
from extproc.types import EndpointId, HttpRequest, PassThrough, Route

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


class Handler:
    """Answers with ``answer`` (or raises it), after ``delay_s``; keeps what it was asked."""

    def __init__(self, answer: object, delay_s: float = 0.0) -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.seen: list[HttpRequest] = []

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        self.seen.append(request)
        await asyncio.sleep(self.delay_s)
        if isinstance(self.answer, BaseException):
            raise self.answer
        assert isinstance(self.answer, Route | PassThrough)
        return self.answer


async def _serving(handler: Handler, options: AuthzOptions | None = None) -> AsyncIterator[int]:
    server = await start_authz_server(handler, options=options)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def handler() -> Handler:
    return Handler(Route((A, B), {"x-router-reason": "prefix"}))


@pytest.fixture
async def port(handler: Handler) -> AsyncIterator[int]:
    async for p in _serving(handler):
        yield p


def check(body: bytes = b'{"model": "m"}', path: str = "/v1/chat/completions?x=1", extra: str = "") -> bytes:
    """A check request as Envoy sends one."""
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:10000\r\ncontent-length: {len(body)}\r\n"
            f"x-request-id: rid-1\r\ncontent-type: application/json\r\n{extra}\r\n").encode() + body  # fmt: skip


async def exchange(port: int, *writes: bytes, answers: int = 1) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``writes`` on one connection, read ``answers`` answers: (status, headers, body) each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for chunk in writes:
            writer.write(chunk)
            await writer.drain()
        out = []
        for _ in range(answers):
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
            lines = head.split("\r\n")
            headers = dict(line.split(": ", 1) for line in lines[1:] if line)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            out.append((int(lines[0].split(" ")[1]), headers, body))
        return out
    finally:
        writer.close()


async def test_a_route_answers_200_with_the_destination_and_the_router_sees_the_request(
    port: int, handler: Handler
) -> None:
    [(status, headers, body)] = await exchange(port, check())
    assert status == 200 and body == b""
    assert headers["x-gateway-destination-endpoint"] == f"{A},{B}" and headers["x-router-reason"] == "prefix"
    [seen] = handler.seen
    assert (seen.method, seen.path, seen.body, seen.request_id) == ("POST", "/v1/chat/completions?x=1",
                                                                    b'{"model": "m"}', "rid-1")  # fmt: skip
    assert seen.headers["content-type"] == "application/json" and seen.headers[":path"] == seen.path
    assert seen.received_at_s is not None


@pytest.mark.parametrize(
    "answer",
    [PassThrough(), RuntimeError("boom"), Route(())],
    ids=["pass-through", "handler-raises", "no-endpoints"],
)
async def test_no_decision_answers_200_without_headers_so_envoy_balances(answer: object) -> None:
    async for port in _serving(Handler(answer)):
        [(status, headers, _)] = await exchange(port, check())
        assert status == 200 and "x-gateway-destination-endpoint" not in headers


async def test_a_slow_handler_passes_through_at_the_route_timeout() -> None:
    async for port in _serving(Handler(Route((A,)), delay_s=2.0), AuthzOptions(route_timeout_s=0.05)):
        [(status, headers, _)] = await exchange(port, check())
        assert status == 200 and "x-gateway-destination-endpoint" not in headers


async def test_a_router_error_reaches_the_client_as_its_status_and_json_body() -> None:
    async for port in _serving(Handler(RouterError("model is required", param="model"))):
        [(status, headers, body)] = await exchange(port, check())
        assert status == 400 and headers["content-type"] == "application/json"
        assert json.loads(body)["error"] == {"message": "model is required", "type": "invalid_request_error",
                                             "param": "model", "code": "invalid_request_error"}  # fmt: skip


async def test_requests_on_one_connection_are_answered_in_order_even_in_pieces(port: int, handler: Handler) -> None:
    first, second = check(b'{"n": 1}', "/one"), check(b'{"n": 2}', "/two")
    both = first + second
    answers = await exchange(port, both[:7], both[7:60], both[60:], answers=2)
    assert [a[0] for a in answers] == [200, 200]
    assert [r.path for r in handler.seen] == ["/one", "/two"] and handler.seen[1].body == b'{"n": 2}'


async def test_a_body_over_the_limit_gets_413_and_the_connection_closes() -> None:
    async for port in _serving(Handler(Route((A,))), AuthzOptions(max_body_bytes=8)):
        [(status, headers, body)] = await exchange(port, check(b"x" * 9))
        assert status == 413 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_too_large"


@pytest.mark.parametrize(
    "raw",
    [b"NOT HTTP\r\n\r\n", b"POST / HTTP/1.1\r\ncontent-length: nine\r\n\r\n",
     b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", b"POST / HTTP/1.1\r\nno colon here\r\n\r\n"],
    ids=["request-line", "content-length", "chunked", "header-line"],
)  # fmt: skip
async def test_what_envoy_never_sends_gets_400_and_a_close(raw: bytes, port: int) -> None:
    [(status, headers, _)] = await exchange(port, raw)
    assert status == 400 and headers["connection"] == "close"


async def test_a_summary_value_cannot_add_lines_to_the_answer() -> None:
    async for port in _serving(Handler(Route((A,), {"x-router-model": "m\r\nx-evil: 1"}))):
        [(status, headers, _)] = await exchange(port, check())
        assert status == 200 and "x-evil" not in headers and headers["x-router-model"] == "m  x-evil: 1"


def test_repeated_headers_join_as_a_list_and_names_are_lower_case() -> None:
    head = b"GET /v1/models HTTP/1.1\r\nX-Tenant: a\r\nx-tenant: b\r\nHost: h"
    request = request_of(head, b"")
    assert request.method == "GET" and request.headers["x-tenant"] == "a, b" and request.headers["host"] == "h"
    assert request.request_id  # none sent: a fresh one, as over ext_proc
