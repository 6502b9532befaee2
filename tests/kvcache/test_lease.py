"""Event-stream leases against a real valkey-server: acquire, renew, expire, take over, fencing, the position."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from extproc.kvcache.gate import Position, SharedState, digest
from extproc.redis.client import client_for
from extproc.redis.leases import StreamLeases
from extproc.redis.prefix_index import FencedOut, RedisPrefixIndex
from extproc.types import BlockHash, EndpointId
from tests.support.clock import FakeClock
from tests.support.polling import until

E = EndpointId("10.0.0.7:8000")
H = [BlockHash(i * 7919 + 1) for i in range(8)]
TTL = 0.6  # short real ttl (ticks every 60 ms); long enough for a busy machine's round trips

Make = Callable[..., Awaitable[tuple[RedisPrefixIndex, StreamLeases]]]


def token(leases: StreamLeases, endpoint: EndpointId = E) -> int | None:
    status = leases.status(endpoint)
    return None if status is None else status.token


@pytest.fixture
async def make(server_url: str) -> AsyncIterator[Make]:
    namespace = f"lease-{uuid.uuid4().hex[:8]}"
    made: list[tuple[RedisPrefixIndex, StreamLeases]] = []

    async def make_one(
        owner: str, *, ttl_s: float = TTL, clock: Callable[[], float] = time.monotonic, start: bool = True
    ) -> tuple[RedisPrefixIndex, StreamLeases]:
        client = client_for(server_url, 1.0)  # the index's and the leases' (as the app shares them)
        index = RedisPrefixIndex(client, namespace=namespace, timeout_s=1.0)
        leases = StreamLeases(client, owner, namespace=namespace, ttl_s=ttl_s, timeout_s=1.0, clock=clock)
        leases.follow(E)
        leases.hearing(E, True)  # its stream is connected (what the subscriber reports)
        if start:
            leases.start()
        made.append((index, leases))
        return index, leases

    yield make_one
    for index, leases in made:
        await leases.close()
        await index.close()


async def test_one_holder_renews_while_the_other_waits(make: Make) -> None:
    _, a = await make("a")
    await until(lambda: token(a) is not None, what="a acquires")
    _, b = await make("b")
    first = token(a)
    await asyncio.sleep(3 * TTL)
    assert token(a) == first and token(b) is None
    assert a.counters.renewals >= 3 and a.counters.lost == 0
    assert b.counters.acquired == 0


@pytest.mark.realtime(
    race="the takeover is timed against the lease ttl on the wall clock; a starved event loop ticks late"
)
async def test_a_crashed_holder_expires_and_is_taken_over_with_the_next_token(make: Make) -> None:
    _, a = await make("a")
    await until(lambda: token(a) is not None, what="a acquires")
    _, b = await make("b")
    first = token(a)
    await a.close(release=False)  # crashed: the lease is left to expire
    took = await until(lambda: token(b) is not None, what="b takes over")
    assert took < TTL + 0.5
    assert token(b) == (first or 0) + 1  # fencing tokens only grow


@pytest.mark.realtime(
    race="the takeover is timed against half a ttl on the wall clock; a starved event loop ticks late"
)
async def test_a_released_lease_is_taken_within_a_tick(make: Make) -> None:
    _, a = await make("a")
    await until(lambda: token(a) is not None, what="a acquires")
    _, b = await make("b")
    await a.close()
    assert a.counters.released == 1
    took = await until(lambda: token(b) is not None, what="b takes over")
    assert took < TTL / 2


async def test_a_deposed_owner_cannot_write(make: Make) -> None:
    index_a, a = await make("a", clock=FakeClock())  # acquires once, then never renews: expires on the server
    await until(lambda: token(a) is not None, what="a acquires")
    assert a.take(E) and a.is_writer(E)
    writes_a = a.writes(index_a)
    await writes_a.store(E, H[:2])
    index_b, b = await make("b")
    await until(lambda: token(b) is not None, what="b takes over")
    assert a.is_writer(E)  # a still believes it holds the lease: only the server's check stops it
    stale = token(a)
    with pytest.raises(FencedOut):
        await index_a.store(E, H[2:4], fence=stale)
    with pytest.raises(FencedOut):
        await index_a.remove(E, H[:1], fence=stale)
    with pytest.raises(FencedOut):
        await index_a.clear(E, fence=stale)
    await writes_a.store(E, H[2:6])  # through ingest's view: refused, counted, and a stops writing
    assert a.counters.fenced_writes == 1 and a.counters.lost == 1 and not a.is_writer(E)
    await writes_a.remove(E, H[:1])
    assert a.counters.skipped_writes == 1 and a.counters.fenced_writes == 1  # no more round trips
    assert await index_b.match(H, [E]) == {E: 2}
    await index_b.store(E, H[2:3])  # unfenced writes (one replica, approximate entries) skip the check
    assert await index_b.match(H, [E]) == {E: 3}


async def test_a_non_holder_skips_its_writes(make: Make) -> None:
    index, a = await make("a")
    await until(lambda: token(a) is not None, what="a acquires")
    index_b, b = await make("b")
    assert not b.take(E) and not b.is_writer(E)
    assert await b.writes(index_b).store(E, H) is False
    assert await b.writes(index_b).clear(E) is False
    assert b.counters.skipped_writes == 2
    assert await index.match(H, [E]) == {}


async def test_the_position_survives_an_owner_change_and_a_deposed_owner_cannot_move_it(make: Make) -> None:
    _, a = await make("a", clock=FakeClock())
    await until(lambda: token(a) is not None, what="a acquires")
    assert await a.position(E) is None
    await a.applied(E, 7, b"batch 7")
    assert a.counters.commits == 0  # not adopted yet: the stream task has not taken over
    assert a.take(E)
    await a.applied(E, 7, b"batch 7")
    assert a.counters.commits == 1
    _, b = await make("b")
    await until(lambda: token(b) is not None, what="b takes over")
    pos = await b.position(E)
    assert pos == Position(7, digest(b"batch 7"))
    assert pos.matches(7, b"batch 7") and not pos.matches(7, b"batch 7 of a restarted engine")
    assert b.take(E)
    await b.applied(E, 8, b"batch 8")
    await a.applied(E, 9, b"batch 9")  # a, paused past its lease, wakes up
    assert a.counters.fenced_writes == 1
    assert await b.position(E) == Position(8, digest(b"batch 8"))


async def test_the_shared_state_is_the_position_and_the_blocks_held(make: Make) -> None:
    index, a = await make("a")
    await until(lambda: token(a) is not None, what="a acquires")
    assert await a.shared_state(E) == SharedState(None, 0)
    assert a.take(E)
    assert await a.writes(index).store(E, H[:3]) is True
    await a.applied(E, 4, b"batch 4")
    _, b = await make("b")  # what a replica that does not write reads to confirm the writer is in step
    assert await b.shared_state(E) == SharedState(Position(4, digest(b"batch 4")), 3)


async def test_a_writer_whose_lease_ran_out_locally_stops_and_must_resume(make: Make) -> None:
    clock = FakeClock()
    index, a = await make("a", clock=clock)
    await until(lambda: token(a) is not None, what="a acquires")
    held = token(a)
    assert a.take(E)
    clock.now += TTL  # its renewals stalled (e.g. a slow Redis) until the local view of the lease ran out
    assert not a.is_writer(E)
    assert await a.writes(index).store(E, H) is False
    assert a.counters.skipped_writes == 1 and await index.match(H, [E]) == {}
    # The keeper notices, acquires again (the server still has it: the same token) and the stream task must
    # resume before writing, so that what it skipped is replayed.
    await until(lambda: a.counters.lost == 1 and token(a) == held, what="reacquired")
    assert a.take(E) and a.is_writer(E)


@pytest.mark.realtime(
    race="a lease renewal (every ttl/3, wall clock) delayed past its ttl by a loaded CPU loses or moves the lease"
)
async def test_many_endpoints_three_replicas_one_holder_each(make: Make) -> None:
    endpoints = [EndpointId(f"10.0.1.{i}:8000") for i in range(20)]
    replicas = []
    for owner in ("a", "b", "c"):
        _, leases = await make(owner, start=False)
        for e in endpoints:
            leases.follow(e)
            leases.hearing(e, True)
        replicas.append(leases)
    for leases in replicas:
        leases.start()
    await until(lambda: all(any(token(r, e) for r in replicas) for e in endpoints), what="every endpoint held")
    await asyncio.sleep(2 * TTL)
    for e in endpoints:
        assert sum(1 for r in replicas if token(r, e) is not None) == 1, e
    assert sum(r.counters.acquired for r in replicas) == len(endpoints) + 1  # + E, followed by every replica
    assert all(r.counters.lost == 0 for r in replicas)


async def test_tokens_keep_growing_when_redis_loses_the_lease_keys(make: Make, server_url: str) -> None:
    import redis.asyncio as aioredis

    index_a, a = await make("a", clock=FakeClock())  # never notices the loss itself
    await until(lambda: token(a) is not None, what="a acquires")
    stale = token(a)
    raw = aioredis.Redis.from_url(server_url)
    try:
        keys = index_a.schema.endpoint(E)
        await raw.delete(keys.lease, keys.stream)  # a Redis restarted empty, or failed over to a lagging replica
    finally:
        await raw.aclose()
    _, b = await make("b")
    await until(lambda: token(b) is not None, what="b acquires")
    assert (token(b) or 0) > (stale or 0)  # the counter restarted from the server's clock, not from 1
    with pytest.raises(FencedOut):
        await index_a.store(E, H[:1], fence=stale)


async def test_only_a_replica_hearing_the_engine_holds_the_lease(make: Make) -> None:
    _, a = await make("a")
    a.hearing(E, False)  # its stream is not connected
    _, b = await make("b", start=False)
    b.hearing(E, False)
    b.start()
    await asyncio.sleep(3 * TTL / 10)
    assert token(a) is None and token(b) is None  # nobody hears the engine: nobody competes
    b.hearing(E, True)
    await until(lambda: token(b) is not None, what="b, which hears it, acquires")
    assert b.take(E)
    a.hearing(E, True)
    b.hearing(E, False)  # partitioned from the engine: b lets go after a ttl, and a takes over
    released = await until(lambda: token(a) is not None, what="a takes over")
    assert TTL * 0.8 < released < TTL * 2
    assert b.counters.released == 1 and not b.is_writer(E)
    b.hearing(E, True)  # a blip shorter than the ttl does not move the lease
    a.hearing(E, False)
    await asyncio.sleep(TTL / 2)
    a.hearing(E, True)
    await asyncio.sleep(TTL)
    assert token(a) is not None and token(b) is None and a.counters.released == 0


async def test_the_keeper_survives_an_unexpected_error(valkey_url: str) -> None:
    import redis.asyncio as aioredis

    class Flaky(aioredis.Redis):
        failures = 2

        async def evalsha(self, *args: Any, **kwargs: Any) -> Any:  # every lease script call
            if self.failures:
                self.failures -= 1
                raise RuntimeError("a bug, not a Redis error")
            return await super().evalsha(*args, **kwargs)

    index = Flaky.from_url(valkey_url)
    leases = StreamLeases(index, "a", namespace=f"lease-{uuid.uuid4().hex[:8]}", ttl_s=TTL, timeout_s=1.0)
    leases.follow(E)
    leases.hearing(E, True)
    leases.start()
    try:
        await until(lambda: token(leases) is not None, what="acquired after two failed ticks")
    finally:
        await leases.close()
        await index.aclose()


@pytest.mark.parametrize(
    ("index", "leased"),
    [
        ({"backend": "memory"}, False),
        ({"backend": "redis", "url": "redis://127.0.0.1:1/0"}, True),
        ({"backend": "redis", "url": "redis://127.0.0.1:1/0", "leases": {"enabled": False}}, False),
    ],
    ids=["memory", "redis", "redis-leases-off"],
)
async def test_the_app_uses_leases_only_with_a_shared_index(index: dict[str, Any], leased: bool) -> None:
    from prometheus_client import generate_latest

    from extproc.app import App
    from tests.support.config import router_config

    app = App(router_config(index=index))  # nothing connects yet (Redis is dialled lazily)
    try:
        assert (app.feed.leases is not None) == leased
        exported = generate_latest(app.metrics.registry).decode()
        assert ("router_kv_lease_acquired_total" in exported) == leased
        assert "router_kv_stream_takeovers_total" in exported
    finally:
        await app.stop()
