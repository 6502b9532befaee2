"""``HttpGetter`` and ``PolledGetter`` against a scripted HTTP server on 127.0.0.1: every framing they must read,
every way they fail; and that a polled answer waits in its socket until collected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from extproc.backends.http_get import (
    MAX_BODY_BYTES,
    GetFailed,
    GetStatus,
    GetUnreachable,
    HttpGetter,
    IdleConnectionLost,
    PolledGetter,
    parse_http_url,
    polled_target,
)
from tests.support.scripted_http import ScriptedServer, ok


class Polled:
    """``PolledGetter`` behind ``HttpGetter.get`` for the shared cases: ready, send, collect until whole; a GET
    on a connection the server dropped while idle goes again once on a new one (as ``HttpGetter`` does)."""

    def __init__(self, getter: PolledGetter) -> None:
        self.getter = getter

    async def get(self) -> bytes:
        try:
            return await self._get()
        except IdleConnectionLost:
            return await self._get()

    async def _get(self) -> bytes:
        await self.getter.ready()
        self.getter.send()
        while (body := self.getter.collect()) is None:
            await asyncio.sleep(0.002)
        return body

    def close(self) -> None:
        self.getter.close()


Client = HttpGetter | Polled


def chunked(*parts: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for part in parts:
        out += f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


@pytest.fixture(params=["awaited", "polled"])
async def getter_for(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[ScriptedServer], Client]]:
    made: list[Client] = []

    def make(server: ScriptedServer, timeout_s: float = 2.0) -> Client:
        if request.param == "awaited":
            made.append(HttpGetter("127.0.0.1", server.port, "/metrics", timeout_s=timeout_s))
        else:
            made.append(Polled(PolledGetter("127.0.0.1", server.port, "/metrics", timeout_s=timeout_s)))
        return made[-1]

    yield make
    for g in made:
        g.close()


async def test_content_length_bodies_on_one_kept_alive_connection(getter_for) -> None:
    async with ScriptedServer(lambda n: ok(b"page %d" % n)) as server:
        getter = getter_for(server)
        assert [await getter.get() for _ in range(3)] == [b"page 0", b"page 1", b"page 2"]
        assert server.connections == 1


async def test_chunked_bodies_and_split_writes(getter_for) -> None:
    async with ScriptedServer(lambda n: chunked(b"vllm:", b"x", b" 1\n") if n == 0 else chunked(b"y")) as server:
        getter = getter_for(server)
        assert await getter.get() == b"vllm:x 1\n"
        assert await getter.get() == b"y"


async def test_a_server_that_closes_idle_connections_is_reconnected_not_failed(getter_for) -> None:
    async with ScriptedServer(lambda n: ok(b"fine"), close_after=True) as server:
        getter = getter_for(server)
        for _ in range(3):
            assert await getter.get() == b"fine"
        assert server.connections == 3


async def test_connection_close_header_is_honoured(getter_for) -> None:
    async with ScriptedServer(lambda n: ok(b"bye", "Connection: close\r\n")) as server:
        getter = getter_for(server)
        assert await getter.get() == b"bye" and await getter.get() == b"bye"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n", GetFailed),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nnop", GetFailed),
        (b"<html>not http</html>\r\n\r\n", GetFailed),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", GetFailed),
        (f"HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(), GetFailed),
        (b"HTTP/1.1 200 OK\r\n\r\nno length", GetFailed),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", GetFailed),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", GetFailed),  # then the server closes
        (None, GetUnreachable),  # closes without a byte
    ],
    ids=["500", "404", "not-http", "bad-length", "too-large", "no-framing", "bad-chunk", "truncated", "dropped"],
)
async def test_bad_answers_raise_and_the_next_call_reconnects(getter_for, answer, error) -> None:
    async with ScriptedServer(lambda n: answer if n == 0 else ok(b"healed"), close_after=True) as server:
        getter = getter_for(server)
        with pytest.raises(error):
            await getter.get()
        assert await getter.get() == b"healed"


async def test_a_slow_server_times_out(getter_for) -> None:
    async with ScriptedServer(lambda n: ok(b"late"), delay_s=1.0) as server:
        with pytest.raises(GetFailed, match="no answer within"):
            await getter_for(server, timeout_s=0.1).get()


async def test_a_refused_connection_is_unreachable() -> None:
    async with ScriptedServer(lambda n: ok(b"")) as server:
        port = server.port
    with pytest.raises(GetUnreachable):
        await HttpGetter("127.0.0.1", port, "/metrics", timeout_s=1.0).get()
    with pytest.raises(GetUnreachable):
        await PolledGetter("127.0.0.1", port, "/metrics", timeout_s=1.0).ready()


async def test_a_polled_answer_waits_in_its_socket_until_collected() -> None:
    async with ScriptedServer(lambda n: ok(b"page %d" % n)) as server:
        getter = PolledGetter("127.0.0.1", server.port, "/metrics", timeout_s=5.0)
        try:
            assert getter.collect() is None and not getter.busy  # nothing sent: nothing to collect
            await getter.ready()
            getter.send()
            assert getter.busy
            with pytest.raises(RuntimeError):
                getter.send()  # one GET at a time
            await asyncio.sleep(0.2)  # the answer arrives; nothing reads it
            assert getter.busy
            assert getter.collect() == b"page 0" and not getter.busy
            await getter.ready()
            getter.send()
            while (body := getter.collect()) is None:
                await asyncio.sleep(0.002)
            assert body == b"page 1" and server.connections == 1
        finally:
            getter.close()


async def test_a_polled_status_is_get_status_and_a_dropped_idle_connection_is_told_apart() -> None:
    answers = [ok(b"first"), None, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", None]
    async with ScriptedServer(lambda n: answers[n] if n < len(answers) else ok(b"x")) as server:
        getter = PolledGetter("127.0.0.1", server.port, "/metrics", timeout_s=5.0)
        try:
            assert await Polled(getter).get() == b"first"
            with pytest.raises(IdleConnectionLost):  # closed without answering, after answering before
                await Polled(getter)._get()
            with pytest.raises(GetStatus) as refused:
                await Polled(getter)._get()
            assert refused.value.status == 404
            with pytest.raises(GetUnreachable) as dropped:  # closed without answering on a new connection
                await Polled(getter)._get()
            assert not isinstance(dropped.value, IdleConnectionLost)
            assert await Polled(getter).get() == b"x"
        finally:
            getter.close()


@pytest.mark.parametrize(
    ("url", "polled"),
    [("http://10.0.0.7:8000/metrics", True), ("http://[::1]:9/metrics", True), ("http://engine:8000/metrics", False),
     ("https://10.0.0.7/metrics", False)],
)  # fmt: skip
def test_only_urls_at_ip_addresses_are_polled(url: str, polled: bool) -> None:
    assert (polled_target(url) is not None) == polled


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("http://10.0.0.7:8000/metrics", ("10.0.0.7", 8000, "/metrics")),
        ("http://host/m?x=1", ("host", 80, "/m?x=1")),
        ("http://[::1]:9/metrics", ("::1", 9, "/metrics")),
        ("https://host/metrics", None),
        ("http://user:pw@host/metrics", None),
        ("http://host:99999/metrics", None),
    ],
)
def test_only_plain_http_urls_use_the_lean_client(url, parsed) -> None:
    assert parse_http_url(url) == parsed
