"""``HttpGetter`` against a scripted HTTP server on 127.0.0.1: every framing it must read, every way it fails."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from extproc.backends.http_get import MAX_BODY_BYTES, GetFailed, GetUnreachable, HttpGetter, parse_http_url
from tests.support.scripted_http import ScriptedServer, ok


def chunked(*parts: bytes) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    for part in parts:
        out += f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


@pytest.fixture
async def getter_for() -> AsyncIterator[Callable[[ScriptedServer], HttpGetter]]:
    made: list[HttpGetter] = []

    def make(server: ScriptedServer, timeout_s: float = 2.0) -> HttpGetter:
        made.append(HttpGetter("127.0.0.1", server.port, "/metrics", timeout_s=timeout_s))
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
