"""The shared load's contract (``extproc.redis.shared_load.SharedQueue``), run against the in-memory reference
(``tests/support/shared_load.py``), Valkey, Redis 7 and a Valkey cluster: two replicas read, add and reserve on
one namespace; a reservation holds only on the version it was decided on, atomically."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from extproc.redis.shared_load import ANY_VERSION, SharedLoad, SharedQueue
from extproc.types import EndpointId
from tests.support.clock import FakeClock
from tests.support.shared_load import MemorySharedLoad

A, B, C = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000"), EndpointId("10.0.0.3:8000")
RATE = 1000.0  # tokens/s
SERVER_TICK_S = 0.001
"""The shared load's script reads Redis ``TIME`` to the millisecond (``shared_load.lua``): the time it drains
between two calls is their floored milliseconds' difference, up to 1 ms more than passed."""


def drained_since(started_s: float) -> float:
    """The most a queue can have drained since ``started_s`` (time.monotonic), at ``RATE``: the slack a bound
    needs on a busy box (a cold cluster client's first call alone can take 100 ms), plus the server clock's tick
    (a fresh-clone CI run read 499.0 tokens of 500 after 0.997 ms by this clock: the tick counted 1 ms); the fake
    clock drains less."""
    return RATE * (time.monotonic() - started_s + SERVER_TICK_S)


@dataclass
class Replicas:
    """``make()`` gives one more replica on the shared namespace; ``advance(s)`` lets time pass."""

    make: Callable[[], SharedQueue]
    advance: Callable[[float], Awaitable[None]]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis7", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[Replicas]:
    if request.param == "memory":
        clock = FakeClock()
        shared = MemorySharedLoad(RATE, clock)

        async def tick(seconds: float) -> None:
            clock.now += seconds

        yield Replicas(lambda: shared, tick)
        return
    fixture = {"redis": "valkey_url", "redis7": "redis7_url", "redis-cluster": "valkey_cluster"}[request.param]
    server = request.getfixturevalue(fixture)
    url = server if isinstance(server, str) else server.url
    ns, made = f"load{uuid.uuid4().hex[:10]}", list[SharedLoad]()

    def make() -> SharedQueue:
        # timeouts for a busy 2-core CI box: the contract is what it answers, not how fast
        made.append(SharedLoad.from_url(url, namespace=ns, prefill_tokens_per_s=RATE, timeout_s=5.0))
        return made[-1]

    try:
        yield Replicas(make, asyncio.sleep)
    finally:
        for load in made:
            await load.close()


async def test_an_endpoint_nobody_reserved_on_is_empty_at_version_zero(replicas: Replicas) -> None:
    view = await replicas.make().read([A, B])
    assert view.tokens == {A: 0.0, B: 0.0} and view.versions == {A: 0, B: 0}


async def test_another_replicas_add_is_seen_with_its_version(replicas: Replicas) -> None:
    one, two = replicas.make(), replicas.make()
    started = time.monotonic()
    await one.add(A, 2000)
    await one.add(A, 0)  # nothing: no version either
    view = await two.read([A, B])
    assert 2000 - drained_since(started) <= view.tokens[A] <= 2000 and view.versions == {A: 1, B: 0}


async def test_a_reservation_holds_on_its_version_only(replicas: Replicas) -> None:
    one, two = replicas.make(), replicas.make()
    seen = await one.read([A, B, C])
    started = time.monotonic()
    await two.add(A, 500)  # between one's read and its reservation
    stale = await one.reserve(A, 1000, seen.versions[A], [A, B, C])
    assert not stale.reserved
    assert 500 - drained_since(started) <= stale.queues.tokens[A] <= 500  # the fresh view
    assert stale.queues.versions == {A: 1, B: 0, C: 0}
    started = time.monotonic()
    fresh = await one.reserve(B, 1000, stale.queues.versions[B], [A, B, C])
    assert fresh.reserved and 1000 - drained_since(started) <= fresh.queues.tokens[B] <= 1000
    assert fresh.queues.versions[B] == 1
    forced = await one.reserve(A, 100, ANY_VERSION, [B])  # the pick is answered for even when not listed
    assert forced.reserved and forced.queues.versions[A] == 2 and set(forced.queues.tokens) == {A, B}


async def test_nothing_to_reserve_changes_nothing(replicas: Replicas) -> None:
    load = replicas.make()
    done = await load.reserve(A, 0, 0, [A])
    assert not done.reserved and done.queues.versions[A] == 0 and done.queues.tokens[A] == 0.0


async def test_draining_never_bumps_the_version(replicas: Replicas) -> None:
    load = replicas.make()
    await load.add(A, 2000)
    await replicas.advance(0.5)  # drains at 1000 tokens/s
    view = await load.read([A])
    assert view.tokens[A] <= 1550 and view.versions[A] == 1
    assert (await load.reserve(A, 10, 1, [A])).reserved  # a reservation decided on a drained view still holds


async def test_of_many_replicas_reserving_on_one_read_exactly_one_wins(replicas: Replicas) -> None:
    loads = [replicas.make() for _ in range(4)]
    seen = await loads[0].read([A])
    done = await asyncio.gather(*(loads[i % 4].reserve(A, 10_000, seen.versions[A], [A]) for i in range(32)))
    assert sum(d.reserved for d in done) == 1
    after = await loads[1].read([A])
    assert 5_000 <= after.tokens[A] <= 10_000 and after.versions[A] == 1  # slack: it drains 1000 tokens/s


async def test_forget_drops_the_queue(replicas: Replicas) -> None:
    load = replicas.make()
    await load.add(A, 1000)
    await load.forget(A)
    view = await load.read([A])
    assert view.tokens[A] == 0.0 and view.versions[A] == 0


async def test_a_reservation_keeps_its_endpoint_busy_for_every_replica(replicas: Replicas) -> None:
    one, two = replicas.make(), replicas.make()
    started = time.monotonic()
    assert (await one.reserve(A, 100, 0, [A, B], busy_s=0.3)).reserved
    view = await two.read([A, B])
    assert 0.3 - (time.monotonic() - started) - SERVER_TICK_S <= view.busy_s[A] <= 0.3 and view.busy_s[B] == 0.0
    await two.add(A, 100, busy_s=0.05)  # a nearer first token does not shorten it
    assert (await one.read([A])).busy_s[A] >= 0.3 - (time.monotonic() - started) - SERVER_TICK_S
    await two.add(B, 100)  # no estimate: tokens only
    assert (await one.read([B])).busy_s[B] == 0.0
    await replicas.advance(0.35)
    assert (await two.read([A])).busy_s[A] == 0.0


async def test_a_stale_reservation_keeps_nothing_busy(replicas: Replicas) -> None:
    one, two = replicas.make(), replicas.make()
    seen = await one.read([A])
    await two.add(A, 500)
    stale = await one.reserve(A, 100, seen.versions[A], [A], busy_s=0.3)
    assert not stale.reserved and stale.queues.busy_s[A] == 0.0


async def test_forget_drops_the_busy_time_too(replicas: Replicas) -> None:
    load = replicas.make()
    await load.add(A, 1000, busy_s=5.0)
    await load.forget(A)
    assert (await load.read([A])).busy_s[A] == 0.0
