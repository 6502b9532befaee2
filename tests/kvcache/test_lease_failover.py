"""Two replicas' ``EventFeed``s on one real valkey-server and one stand-in vLLM publisher (PUB + replay ROUTER):
exactly one applies the stream; kill it and the other takes over within 3 s, resumes from the stored position
through the ROUTER, and the writes reaching Redis are exactly the engine's, once each."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import zmq.asyncio

from extproc.kvcache.feed import EventFeed
from extproc.kvcache.index import Chain, IndexUnavailable
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.subscriber import EventSource, SubscriberOptions
from extproc.redis.client import client_for
from extproc.redis.leases import StreamLeases
from extproc.redis.prefix_index import RedisPrefixIndex
from extproc.types import BlockHash, EndpointId, HashScheme
from tests.support.polling import until

from .vllm_pub import HASHES, FakePublisher, batch, removed, stored

E = EndpointId("127.0.0.1:8001")
# The default poll tick and lease ttl (2 s): what the 3 s failover promise is made with.
OPTIONS = SubscriberOptions(replay_timeout_s=3.0, backoff_initial_s=0.05)
TTL_S = 2.0

Op = tuple[str, tuple[int, ...]]


class RecordingIndex(RedisPrefixIndex):
    """The shared index, recording each fenced write the server accepted (the writes made for the stream)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ops: list[Op] = []
        self.fail_stores = 0  # the next this many stores fail as if Redis timed out

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
        fence: int | None = None,
    ) -> None:
        if self.fail_stores:
            self.fail_stores -= 1
            raise IndexUnavailable("injected: no answer")
        await super().store(endpoint, hashes, ttl_s=ttl_s, chain=chain, fence=fence)
        if fence is not None:
            self.ops.append(("store", tuple(hashes)))

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, fence: int | None = None) -> None:
        await super().remove(endpoint, hashes, fence=fence)
        if fence is not None:
            self.ops.append(("remove", tuple(hashes)))

    async def clear(self, endpoint: EndpointId, *, fence: int | None = None) -> None:
        await super().clear(endpoint, fence=fence)
        if fence is not None:
            self.ops.append(("clear", ()))


@dataclass
class Replica:
    index: RecordingIndex
    leases: StreamLeases
    feed: EventFeed
    alive: bool = True

    def last_seq(self) -> int | None:
        status = self.feed.subscriber.status(E)
        return None if status is None else status.last_seq

    async def kill(self) -> None:
        """A crash: its stream stops mid-flight and its lease is left to expire (not released)."""
        self.alive = False
        await self.feed.subscriber.close()
        await self.leases.close(release=False)


@dataclass
class Engine:
    """The publisher and the truth: which blocks the engine holds, and the index writes its batches mean."""

    pub: FakePublisher
    rng: random.Random
    held: set[int]
    ops: list[Op]

    async def run(self, n: int, *, drop: float = 0.1, ts: float = 1.0, end_empty: bool = True) -> None:
        """``n`` random store/remove batches, ``drop`` of them lost on the PUB side (replay still has them),
        then (``end_empty``) an empty batch so that a trailing drop is noticed."""
        for _ in range(n):
            if self.rng.random() < 0.6 or not self.held:
                first = self.rng.randrange(0, len(HASHES) - 4)
                payload = batch(stored(first, 4), ts=ts)
                self.held |= set(HASHES[first : first + 4])
                self.ops.append(("store", tuple(HASHES[first : first + 4])))
            else:
                block = HASHES.index(self.rng.choice(sorted(self.held)))
                payload = batch(removed(block), ts=ts)
                self.held.discard(HASHES[block])
                self.ops.append(("remove", (HASHES[block],)))
            if self.rng.random() < drop:
                self.pub.drop(payload)
            else:
                await self.pub.publish(payload)
            await asyncio.sleep(0.002)
        if end_empty:
            await self.pub.publish(batch(ts=ts))


@contextlib.asynccontextmanager
async def fleet(valkey_url: str) -> AsyncIterator[tuple[Engine, Callable[..., Replica]]]:
    """One engine; ``spawn(owner)`` starts a replica (its own Redis client, approximate index and feed);
    ``spawn(owner, deaf=True)``: one that dials a PUB address nobody serves."""
    namespace = f"failover-{uuid.uuid4().hex[:8]}"
    ctx = zmq.asyncio.Context()
    pub = FakePublisher(ctx)
    pub.start()
    replicas: list[Replica] = []

    def spawn(owner: str, *, deaf: bool = False) -> Replica:
        client = client_for(valkey_url, 1.0)  # the index's and the leases' (as the app shares them)
        index = RecordingIndex(client, namespace=namespace, timeout_s=1.0)
        leases = StreamLeases(client, owner, namespace=namespace, ttl_s=TTL_S, timeout_s=1.0)
        address = f"ipc:///tmp/nobody-{uuid.uuid4().hex}" if deaf else pub.pub_address
        source = EventSource(E, address, pub.replay_address)
        feed = EventFeed(
            [source], leases.writes(index), MemoryPrefixIndex(), lambda _e: HashScheme(), OPTIONS, leases=leases
        )
        feed.start()
        replicas.append(replica := Replica(index, leases, feed))
        return replica

    try:
        yield Engine(pub, random.Random(11), set(), []), spawn
    finally:
        for r in replicas:
            if r.alive:
                await r.feed.stop()
            await r.index.close()
        await pub.close()
        ctx.destroy(linger=0)


async def warm_up(engine: Engine, replicas: Sequence[Replica]) -> None:
    """Empty batches until every replica's subscription is live, then wait until all have seen the last one."""
    for _ in range(300):
        await engine.pub.publish(batch())
        await asyncio.sleep(0.02)
        if all(r.last_seq() is not None for r in replicas):
            break
    await settle(engine, replicas)


async def settle(engine: Engine, replicas: Sequence[Replica]) -> None:
    last = engine.pub.seq - 1
    await until(lambda: all(r.last_seq() == last for r in replicas), what=f"seq {last} everywhere")


async def assert_index_is(index: RedisPrefixIndex, held: set[int]) -> None:
    assert await index.entries(E) == len(held)
    for h in HASHES:
        assert (await index.match([BlockHash(h)], [E]) == {E: 1}) == (h in held), h


@pytest.mark.realtime(
    race="the failover is timed (< 3 s) on the wall clock against a 1 s lease; a starved event loop ticks late"
)
async def test_one_replica_applies_and_the_other_takes_over_where_it_stopped(valkey_url: str) -> None:
    async with fleet(valkey_url) as (engine, spawn):
        a = spawn("a")
        await until(lambda: a.leases.is_writer(E), what="a is the writer")
        b = spawn("b")
        await warm_up(engine, [a, b])
        a.index.ops.clear()  # a's start-up purge; from here on only the engine's batches are written

        await engine.run(120)
        await engine.run(1, drop=0.0, end_empty=False)  # the stored position is a batch with writes
        await settle(engine, [a, b])
        assert a.index.ops == engine.ops  # a applied each batch once, gaps filled by replay
        assert b.index.ops == [] and b.leases.counters.skipped_writes > 0  # b only observed
        assert a.feed.subscriber.status(E).writer and not b.feed.subscriber.status(E).writer  # type: ignore[union-attr]
        position = await b.leases.position(E)
        assert position is not None and position.seq == engine.pub.seq - 1

        await a.kill()
        killed = time.monotonic()
        await engine.run(20)  # published while nobody writes: b sees them, skips them, then replays them
        await until(lambda: b.feed.subscriber.counters.resumes == 1, what="b resumes")
        took = time.monotonic() - killed
        print(f"failover: b resumed {took:.2f}s after a was killed")
        assert took < 3.0
        assert engine.pub.replay_requests[-1] == position.seq  # from the stored batch itself (digest check)

        await engine.run(120)
        await settle(engine, [b])
        assert a.index.ops + b.index.ops == engine.ops  # nothing applied twice, nothing missing, no purge
        assert b.feed.subscriber.counters.resume_failures == 0
        assert b.leases.counters.acquired == 1 and b.leases.counters.fenced_writes == 0
        await assert_index_is(b.index, engine.held)


async def test_an_engine_restarted_while_nobody_wrote_is_rebuilt_not_resumed(valkey_url: str) -> None:
    async with fleet(valkey_url) as (engine, spawn):
        a = spawn("a")
        await until(lambda: a.leases.is_writer(E), what="a is the writer")
        b = spawn("b")
        await warm_up(engine, [a, b])
        await engine.run(30, drop=0.0)
        await settle(engine, [a, b])
        position = await b.leases.position(E)
        assert position is not None

        await a.kill()
        engine.pub.restart_counter()  # a new engine process: seq from 0, an empty cache, other timestamps
        engine.held.clear()
        await engine.run(position.seq + 10, drop=0.0, ts=2.0)  # it reuses the stored seq with another batch
        await until(lambda: b.feed.subscriber.counters.resume_failures == 1, what="b falls back")
        await settle(engine, [b])
        assert b.feed.subscriber.counters.resumes == 0
        assert ("clear", ()) in b.index.ops  # purged, then rebuilt from the new engine's whole history
        await assert_index_is(b.index, engine.held)
        status = b.feed.subscriber.status(E)
        assert status is not None and status.writer and not status.cold


async def test_a_batch_whose_write_failed_is_not_committed(valkey_url: str) -> None:
    async with fleet(valkey_url) as (engine, spawn):
        a = spawn("a")
        await until(lambda: a.leases.is_writer(E), what="a is the writer")
        await warm_up(engine, [a])
        ok = await engine.pub.publish(batch(stored(0, 4)))
        await settle(engine, [a])
        assert (await a.leases.position(E)).seq == ok  # type: ignore[union-attr]
        a.index.fail_stores = 1
        await engine.pub.publish(batch(stored(4, 4)))  # its store is lost: ingest will purge before the next
        await settle(engine, [a])
        assert (await a.leases.position(E)).seq == ok  # type: ignore[union-attr]
        assert a.feed.ingest.status(E).cold  # until the purge that retries it lands
        last = await engine.pub.publish(batch(stored(0, 2)))
        await settle(engine, [a])
        assert (await a.leases.position(E)).seq == last  # type: ignore[union-attr]
        assert a.index.ops[-2:] == [("clear", ()), ("store", tuple(HASHES[:2]))]


async def test_a_replica_that_cannot_hear_the_engine_never_becomes_its_writer(valkey_url: str) -> None:
    async with fleet(valkey_url) as (engine, spawn):
        deaf = spawn("deaf", deaf=True)  # first to start, but its SUB never connects
        await asyncio.sleep(0.5)
        b = spawn("b")
        await until(lambda: b.leases.is_writer(E), what="b is the writer")
        await warm_up(engine, [b])
        await engine.run(40)
        await settle(engine, [b])
        assert deaf.leases.counters.acquired == 0 and deaf.index.ops == []
        await assert_index_is(b.index, engine.held)
