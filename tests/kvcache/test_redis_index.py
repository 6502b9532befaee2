"""Redis backend specifics beyond the contract suite: round trips, failures, deadlines, reclaiming, schema."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.valkey import Valkey
from extproc.kvcache.index import Chain, IndexUnavailable
from extproc.redis.prefix_index import RedisPrefixIndex
from extproc.types import BlockHash, EndpointId

pytestmark = pytest.mark.redis

E1, E2 = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def hs(n: int, base: int = 1) -> list[BlockHash]:
    return [BlockHash((base + i) % 2**64) for i in range(n)]


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
        raw = aioredis.Redis.from_url(valkey_url)
        await raw.config_resetstat()
        assert await idx.match(blocks, [E1, E2]) == {E1: 2048, E2: 100}  # packed by hand, sent on the pool
        stats = await raw.info("commandstats")
        await raw.aclose()
        assert stats["cmdstat_evalsha"]["calls"] == 1 and client.sent == []
        client.sent.clear()
        await idx.store(E1, hs(3000, base=10**6))
        await idx.remove(E1, hs(3000, base=10**6))
        assert client.sent == ["EVALSHA", "EVALSHA"]
    finally:
        await idx.close()


async def test_keys_share_the_namespace_hash_tag_and_clear_leaves_nothing(valkey_url: str) -> None:
    ns = f"k{uuid.uuid4().hex[:8]}"
    idx = await RedisPrefixIndex.connect(valkey_url, namespace=ns)
    raw = aioredis.Redis.from_url(valkey_url)
    try:
        await idx.store(E1, hs(5))
        await idx.store(E2, hs(5), ttl_s=60)
        keys = {k.decode() for k in await raw.keys("*") if k.startswith(f"{{{ns}}}".encode())}
        own = ("m", "slots", "next", "u", f"h:{E1}", f"h:{E2}", f"x:{E2}")  # u: entries stored without a chain
        assert keys == {f"{{{ns}}}:{k}" for k in own}
        await idx.clear(E1)
        await idx.clear(E2)
        left = {k.decode() for k in await raw.keys(f"{{{ns}}}*")}
        assert left == {f"{{{ns}}}:free", f"{{{ns}}}:next"}  # no block, no endpoint entry
        assert await raw.zrange(f"{{{ns}}}:free", 0, -1) == [b"0", b"1"]
        await idx.store(EndpointId("10.0.0.9:1"), hs(1))  # a freed slot is reused
        assert await raw.hget(f"{{{ns}}}:slots", "10.0.0.9:1") == b"0"
    finally:
        await raw.aclose()
        await idx.close()


async def test_clear_in_slices(index: RedisPrefixIndex, monkeypatch: pytest.MonkeyPatch) -> None:
    from extproc.redis import prefix_index as redis_index

    monkeypatch.setattr(redis_index, "_CLEAR_SLICE", 100)
    blocks = hs(1050)
    await index.store(E1, blocks, ttl_s=60)
    await index.store(E2, blocks)
    await index.clear(E1)
    assert await index.entries(E1) == 0
    assert await index.match(blocks, [E1, E2]) == {E2: 1050}


async def test_match_cost_does_not_grow_with_endpoints_on_shared_blocks(valkey_url: str) -> None:
    """40 endpoints holding the same 2,000 blocks: one walk, not 40 (checked through commandstats)."""
    ns = f"k{uuid.uuid4().hex[:8]}"
    idx = await RedisPrefixIndex.connect(valkey_url, namespace=ns)
    raw = aioredis.Redis.from_url(valkey_url)
    try:
        blocks = hs(2000)
        eps = [EndpointId(f"10.2.0.{i}:8000") for i in range(40)]
        for e in eps:
            await idx.store(e, blocks)
        await raw.config_resetstat()
        assert await idx.match(blocks, eps) == {e: 2000 for e in eps}
        stats = await raw.info("commandstats")
        assert stats["cmdstat_hmget"]["calls"] <= 12  # slices 16, 32, ... over {ns}:m, plus the slot lookup
    finally:
        await raw.aclose()
        await idx.close()


async def test_mixed_ttls_expire_exactly_and_are_reclaimed_by_match(index: RedisPrefixIndex) -> None:
    a, b, c, d = hs(4)
    await index.store(E1, [a, b, c])
    await index.store(E1, [b], ttl_s=0.15)  # b now expires; a and c never do
    await index.store(E1, [d], ttl_s=30)
    await asyncio.sleep(0.3)
    assert await index.match([a, b, c], [E1]) == {E1: 1}
    assert await index.entries(E1) == 3  # the match dropped b
    await index.store(E1, [b])  # back, without a ttl
    assert await index.match([a, b, c, d], [E1]) == {E1: 4}


async def test_a_backlog_bigger_than_one_drain_is_verified_per_block(
    valkey_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from extproc.redis import scripts as redis_lua

    monkeypatch.setattr(redis_lua, "DRAIN_PER_MATCH", 2)
    monkeypatch.setattr(redis_lua, "RECLAIM_PER_STORE", 2)
    idx = await RedisPrefixIndex.connect(valkey_url, namespace=f"k{uuid.uuid4().hex[:8]}")
    try:
        blocks = hs(20)
        await idx.store(E1, blocks[:5])
        await idx.store(E1, blocks[5:15], ttl_s=0.1)
        await idx.store(E1, blocks[15:])
        await asyncio.sleep(0.25)
        assert await idx.match(blocks, [E1]) == {E1: 5}  # 10 expired, only 2 dropped: verified
        assert await idx.entries(E1) == 18
        for _ in range(5):
            await idx.match(blocks, [E1])
        assert await idx.entries(E1) == 10  # drained over the next matches
        assert await idx.match(blocks, [E1]) == {E1: 5}
    finally:
        await idx.close()


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


@pytest.mark.realtime(race="a 0.2 s deadline must fire within 1 s of wall clock; a starved event loop wakes late")
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
    server = Valkey().start()
    try:
        idx = await RedisPrefixIndex.connect(server.url, timeout_s=0.5)
        await idx.store(E1, hs(3))
    finally:
        server.stop()
    try:
        with pytest.raises(IndexUnavailable):
            await idx.match(hs(3), [E1])
    finally:
        await idx.close()


@pytest.mark.parametrize("capacity", [None, 5])
@pytest.mark.parametrize("seed", range(3))
async def test_random_capacity_operations_agree_with_the_reference(
    index: RedisPrefixIndex, seed: int, capacity: int | None
) -> None:
    """Same model as the memory backend's randomized test (no TTLs: real time would make it flaky)."""
    import random

    from tests.support.clock import FakeClock

    from .test_memory_index import ReferenceIndex

    index._capacity = capacity
    rng = random.Random(seed)
    ref = ReferenceIndex(capacity, FakeClock(0.0))
    universe = hs(10, base=2**64 - 10)
    eps = [EndpointId(f"e{i}:1") for i in range(4)]
    for _ in range(120):
        op, e = rng.random(), rng.choice(eps)
        picked = rng.sample(universe, rng.randint(0, 5))
        if op < 0.45:
            await index.store(e, picked)
            ref.store(e, picked, None)
        elif op < 0.55:
            await index.remove(e, picked)
            ref.remove(e, picked)
        elif op < 0.6:
            await index.clear(e)
            ref.held.pop(e, None)
        else:
            query = universe[: rng.randint(0, 10)]
            asked = rng.sample(eps, rng.randint(0, 4))
            assert await index.match(query, asked) == ref.match(query, asked)


async def test_scripts_flushed_on_the_server_are_reloaded(index: RedisPrefixIndex, valkey_url: str) -> None:
    """After a failover or SCRIPT FLUSH the server forgets our scripts: EVALSHA falls back and reloads."""
    await index.store(E1, hs(3))
    raw = aioredis.Redis.from_url(valkey_url)
    try:
        await raw.script_flush()
    finally:
        await raw.aclose()
    assert await index.match(hs(3), [E1]) == {E1: 3}
    await index.store(E1, hs(1, base=100))
    await index.clear(E1)
    assert await index.match(hs(3), [E1]) == {}


async def test_what_makes_an_endpoint_clean_for_bisection(index: RedisPrefixIndex) -> None:
    """Clean (every entry rooted, no rooted entry without its parent) lets ``match`` bisect."""
    blocks = hs(12)
    await index.store(E1, blocks[:6], chain=Chain.from_root())
    assert await index.chain_state(E1) == (0, 0)
    await index.store(E1, blocks[6:], chain=Chain.after(blocks[5]))
    await index.remove(E1, blocks[:7:-1])  # leaf first, as vLLM evicts
    assert await index.chain_state(E1) == (0, 0)
    await index.store(E2, blocks[8:], chain=Chain.after(blocks[7]))  # its parent is not held there
    assert await index.chain_state(E2) == (4, 0)
    await index.store(E2, blocks[:3])  # no claim
    assert await index.chain_state(E2) == (7, 0)
    await index.remove(E1, blocks[2:3])  # a middle block: its children lose their root
    assert await index.chain_state(E1) == (0, 1)
    assert await index.match(blocks, [E1, E2]) == {E1: 2, E2: 3}
    await index.remove(E1, blocks[3:8][::-1])  # the orphan and what hangs from it go, leaf first
    assert await index.chain_state(E1) == (0, 0)
    await index.clear(E1)
    await index.clear(E2)
    assert await index.chain_state(E1) == (0, 0) and await index.chain_state(E2) == (0, 0)


async def test_a_long_chain_expiring_across_drains_leaves_the_endpoint_clean(index: RedisPrefixIndex) -> None:
    """Expired entries go 256 per call, parents maybe before their children: the orphans are counted and
    uncounted again, so once all are gone the endpoint is clean (and bisects) again."""
    blocks = hs(700)
    await index.store(E1, blocks[:2], chain=Chain.from_root())
    await index.store(E1, blocks[2:], ttl_s=0.5, chain=Chain.after(blocks[1]))
    await asyncio.sleep(0.8)
    for _ in range(4):
        await index.match(blocks, [E1])  # each drains up to 256 expired entries first
    assert await index.entries(E1) == 2
    assert await index.chain_state(E1) == (0, 0)
    assert await index.match(blocks, [E1]) == {E1: 2}


async def test_lookups_count_how_they_were_answered(index: RedisPrefixIndex) -> None:
    blocks = hs(64)
    await index.store(E1, blocks[:40], chain=Chain.from_root())
    await index.store(E2, blocks[:10], chain=Chain.from_root())
    assert await index.match(blocks, [E1, E2]) == {E1: 40, E2: 10}
    assert (index.lookups.bisected, index.lookups.walked) == (1, 0)
    await index.store(E2, blocks[30:35])  # no claim: E2 is no longer clean
    assert await index.match(blocks, [E1, E2]) == {E1: 40, E2: 10}
    assert (index.lookups.bisected, index.lookups.walked) == (1, 1)
    assert await index.match(blocks, [E1]) == {E1: 40}  # only clean endpoints asked about
    assert (index.lookups.bisected, index.lookups.walked) == (2, 1)


async def test_a_lookup_survives_a_flushed_script_cache(index: RedisPrefixIndex, valkey_url: str) -> None:
    """The hand-packed EVALSHA meets NOSCRIPT (a restarted or flushed server): the script is loaded again."""
    blocks = hs(8)
    await index.store(E1, blocks, chain=Chain.from_root())
    raw = aioredis.Redis.from_url(valkey_url)
    try:
        await raw.script_flush()
    finally:
        await raw.aclose()
    assert await index.match(blocks, [E1, E2]) == {E1: 8}
    assert await index.match(blocks, [E1]) == {E1: 8}  # and the fast path works again
