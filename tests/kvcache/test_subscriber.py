"""The subscriber against a real ZMQ PUB + ROUTER on 127.0.0.1 (tests/kvcache/vllm_pub.py), bounded waits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import pytest
import zmq
import zmq.asyncio

from extproc.kvcache.gate import Position, SharedState, digest
from extproc.kvcache.ingest import Ingest, IngestCounters
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.subscriber import EventSource, KvEventSubscriber, StreamCounters, SubscriberOptions, _Readable
from extproc.types import BlockHash, EndpointId, HashScheme
from tests.support.polling import until
from vllm_sim.events import AllBlocksCleared

from .vllm_pub import (
    GOLDEN_PAYLOAD,
    HASHES,
    FakePublisher,
    FutureEvent,
    batch,
    removed,
    stored,
)

E = EndpointId("127.0.0.1:8001")
# Generous replay timeout: a busy CI machine must not turn a slow replay into a "failed" one.
OPTIONS = SubscriberOptions(replay_timeout_s=3.0, poll_interval_s=0.05, backoff_initial_s=0.05)
QUICK_GIVE_UP = SubscriberOptions(replay_timeout_s=0.4, poll_interval_s=0.05, backoff_initial_s=0.05)
ALL = [BlockHash(h) for h in HASHES]


@pytest.fixture(autouse=True, params=[False, True], ids=["on-arrival", "paced"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Every test here runs twice: messages read as they arrive, and paced (read when ``pace`` is called, as
    each scrape round does, or when the stream's poll interval passes)."""
    for name in ("OPTIONS", "QUICK_GIVE_UP"):
        monkeypatch.setitem(globals(), name, replace(globals()[name], paced=request.param))
    return bool(request.param)


@dataclass
class Rig:
    ctx: zmq.asyncio.Context
    pub: FakePublisher
    sub: KvEventSubscriber
    index: MemoryPrefixIndex
    ingest: Ingest

    def held(self) -> int:
        return self.index.match_sync(ALL, [E]).get(E, 0)

    async def settle(self) -> None:
        """Wait until every batch published so far has been handled by the subscriber (pacing it as a scrape
        round would, where it is paced)."""

        def handled() -> bool:
            done = (s := self.sub.status(E)) is not None and s.last_seq == self.pub.seq - 1
            if not done:  # a round only while something is left: none may look at what comes after
                self.sub.pace()
            return done

        await until(handled, what=f"seq {self.pub.seq - 1}")

    async def warm_up(self) -> None:
        """Publish empty batches until the subscription is live (ZMQ's slow joiner), settle, reset counters."""
        for _ in range(300):
            await self.pub.publish(batch())
            await asyncio.sleep(0.02)
            status = self.sub.status(E)
            if status is not None and status.last_seq is not None:
                break
        await self.settle()
        self.sub.counters = StreamCounters()
        self.ingest.counters = IngestCounters()
        self.pub.replay_requests.clear()


@contextlib.asynccontextmanager
async def rig(
    *,
    replay: bool = True,
    replay_with_topic: bool = True,
    bind: bool = False,
    options: SubscriberOptions | None = None,
) -> AsyncIterator[Rig]:
    options = options or OPTIONS
    ctx = zmq.asyncio.Context()
    index = MemoryPrefixIndex()
    ingest = Ingest(index, lambda _e: HashScheme())
    sub = KvEventSubscriber(ingest, options=options, context=ctx)
    pub = FakePublisher(ctx, replay_with_topic=replay_with_topic)
    try:
        if bind:
            pub.start(connect_to=None)  # ROUTER bound; PUB bound too but unused until re-pointed below
            sub.add(EventSource(E, "tcp://127.0.0.1:*", pub.replay_address if replay else None, bind=True))
            await until(lambda: sub.bound_address(E) is not None, what="bind")
            pub.pub.close(linger=0)
            pub.pub = ctx.socket(zmq.PUB)
            pub.pub.connect(str(sub.bound_address(E)))
        else:
            pub.start()
            sub.add(EventSource(E, pub.pub_address, pub.replay_address if replay else None))
        r = Rig(ctx, pub, sub, index, ingest)
        await r.warm_up()
        yield r
    finally:
        await sub.close()
        await pub.close()
        ctx.destroy(linger=0)


async def test_events_apply_in_order() -> None:
    async with rig() as r:
        await r.pub.publish(GOLDEN_PAYLOAD)  # stores 0-4, removes 4, clears everything
        await r.settle()
        c = r.ingest.counters
        assert (c.blocks_stored, c.blocks_removed, c.clears, c.selfchecks) == (5, 1, 1, 1)
        assert r.held() == 0
        await r.pub.publish(batch(stored(0, 3)))
        await r.pub.publish(batch(stored(3, 2)))
        await r.settle()
        assert r.held() == 5
        await r.pub.publish(batch(removed(4)))
        await r.settle()
        assert r.held() == 4
        status = r.sub.status(E)
        assert status is not None and status.connected and status.trusted and not status.cold
        assert status.last_event_s is not None
        assert r.sub.is_precise(E) and not r.sub.is_precise(EndpointId("10.9.9.9:1"))
        await r.pub.publish(batch(AllBlocksCleared()))
        await r.settle()
        assert not r.sub.is_precise(E)  # cold
        assert r.sub.counters.gaps == 0 and r.pub.replay_requests == []


@pytest.mark.parametrize("with_topic", [True, False], ids=["replay>=0.26", "replay<=0.25"])
async def test_gap_is_filled_by_replay(with_topic: bool) -> None:
    async with rig(replay_with_topic=with_topic) as r:
        await r.pub.publish(batch(stored(0, 3)))
        lost = r.pub.drop(batch(stored(3, 2)))
        r.pub.drop(batch(stored(5, 1)))
        await r.pub.publish(batch(stored(6, 2)))
        await r.settle()
        assert r.pub.replay_requests == [lost]
        assert r.held() == 8
        c = r.sub.counters
        assert (c.gaps, c.replays, c.replay_failures, c.replayed_batches) == (1, 1, 0, 2)
        assert not r.sub.status(E).cold  # type: ignore[union-attr]


async def test_incomplete_replay_purges() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        purges = r.ingest.counters.purges
        lost = r.pub.drop(batch(stored(3, 2)))
        r.pub.drop(batch(stored(5, 1)))
        r.pub.forget(lost)  # the buffer rolled over: replay starts later than asked
        await r.pub.publish(batch(stored(6, 2)))
        await r.settle()
        assert r.sub.counters.replay_failures == 1
        assert r.ingest.counters.purges == purges + 1
        assert r.held() == 0  # blocks 0-2 purged; the replayed tail (5) and 6-7 stored but not a prefix
        assert r.index.match_sync(ALL[5:], [E]) == {E: 3}


async def test_gap_without_replay_endpoint_purges() -> None:
    async with rig(replay=False) as r:
        await r.pub.publish(batch(stored(0, 3)))
        r.pub.drop(batch(removed(2)))
        await r.pub.publish(batch(stored(3, 1)))
        await r.settle()
        assert r.sub.counters.gaps == 1 and r.sub.counters.replays == 0
        assert r.held() == 0


async def test_replay_that_never_answers_purges_within_the_timeout() -> None:
    async with rig(options=QUICK_GIVE_UP) as r:
        silent = r.ctx.socket(zmq.ROUTER)  # accepts the request, never replies
        port = silent.bind_to_random_port("tcp://127.0.0.1")
        try:
            await r.sub.remove(E, clear=False)
            r.sub.add(EventSource(E, r.pub.pub_address, f"tcp://127.0.0.1:{port}"))
            await r.warm_up()
            await r.pub.publish(batch(stored(0, 3)))
            r.pub.drop(batch(stored(3, 1)))
            await r.pub.publish(batch(stored(4, 1)))
            await r.settle()
            assert r.sub.counters.replay_failures == 1
            assert r.held() == 0
        finally:
            silent.close(linger=0)


async def test_sequence_going_back_is_a_restart() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.settle()
        r.pub.restart_counter()
        await r.pub.publish(batch(stored(0, 1)))
        await r.settle()
        assert r.sub.counters.restarts == 1
        assert r.held() == 1  # everything before the restart was purged


async def test_restart_seen_late_recovers_what_the_new_process_published_first() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.pub.publish(batch(stored(3, 3)))
        await r.settle()
        r.pub.restart_counter()
        r.pub.drop(batch(stored(0, 2)))  # seq 0 of the new process, lost on the way
        await r.pub.publish(batch(stored(2, 1)))  # seq 1: "went back" from 2+
        await r.settle()
        assert r.sub.counters.restarts == 1 and r.sub.counters.bootstraps == 1
        assert r.held() == 3  # the old process's blocks 3-5 are gone; 0-2 came from the new one


async def test_all_blocks_cleared() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.pub.publish(batch(AllBlocksCleared()))
        await r.settle()
        assert r.held() == 0
        assert r.sub.status(E).cold  # type: ignore[union-attr]
        await r.pub.publish(batch(stored(0, 2)))
        await r.settle()
        assert r.held() == 2 and not r.sub.status(E).cold  # type: ignore[union-attr]


async def test_garbage_is_survived() -> None:
    async with rig() as r:
        await r.pub.send_raw([b"", b"\x00" * 8])  # two frames
        await r.pub.send_raw([b"", b"\x00" * 3, b"x"])  # short sequence number
        await r.pub.publish(b"\x93\xcb\x00")  # truncated payload (consumes a sequence number)
        await r.pub.publish(b"\xc1garbage")
        await r.pub.publish(batch(FutureEvent(), stored(0, 2)))  # unknown tag beside a known one
        await r.settle()
        assert r.sub.counters.bad_frames == 2
        assert r.sub.counters.decode_errors == 2
        assert r.ingest.counters.unknown_events == 1
        assert r.held() == 2
        assert r.sub.counters.loop_errors == 0


async def test_selfcheck_mismatch_marks_untrusted_until_a_check_passes() -> None:
    async with rig() as r:
        wrong = [h ^ 1 for h in HASHES[:2]]
        await r.pub.publish(batch(stored(0, 2, hashes=wrong)))
        await r.settle()
        status = r.sub.status(E)
        assert status is not None and not status.trusted
        assert r.ingest.counters.selfcheck_mismatches == 1
        assert not r.sub.is_precise(E)
        await r.pub.publish(batch(stored(0, 2)))
        await r.settle()
        assert r.sub.status(E).trusted  # type: ignore[union-attr]
        assert r.held() == 2


async def test_bind_mode_engine_connects_to_us() -> None:
    async with rig(bind=True) as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.settle()
        assert r.held() == 3
        assert r.sub.status(E).connected  # type: ignore[union-attr]


async def _bounce(r: Rig, *, lose_history: bool) -> None:
    """The engine's PUB goes away and comes back on the same port (optionally as a restarted process)."""
    port = int(r.pub.pub_address.rsplit(":", 1)[1])
    r.pub.pub.close(linger=0)
    await until(lambda: not r.sub.status(E).connected, what="disconnect")  # type: ignore[union-attr]
    if lose_history:
        r.pub.restart_counter()
    r.pub.pub = r.ctx.socket(zmq.PUB)
    for _ in range(100):
        try:
            r.pub.pub.bind(f"tcp://127.0.0.1:{port}")
            break
        except zmq.ZMQError:
            await asyncio.sleep(0.02)
    # The bootstrap has finished once the endpoint is warm again (the reconnect made it cold first).
    await until(lambda: r.sub.counters.reconnects == 1 and not r.sub.status(E).cold, what="rebuild")  # type: ignore[union-attr]


async def test_reconnect_purges_then_rebuilds_from_the_replay_buffer() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.settle()
        await _bounce(r, lose_history=False)  # a network blip: the engine still buffers seq 0 onwards
        assert r.ingest.counters.purges == 1
        assert r.sub.counters.bootstraps_complete == 1
        assert r.held() == 3 and not r.sub.status(E).cold  # type: ignore[union-attr]
        await r.pub.publish(batch(stored(3, 1)))
        await r.settle()
        assert r.held() == 4


async def test_reconnect_to_a_restarted_engine_starts_empty_and_warm() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.settle()
        await _bounce(r, lose_history=True)  # a new process: sequence 0, empty buffer
        assert r.held() == 0
        assert r.sub.status(E).last_seq is None and not r.sub.status(E).cold  # type: ignore[union-attr]
        await r.pub.publish(batch(stored(0, 1)))  # seq 0 of the new process
        await r.settle()
        assert r.held() == 1 and r.sub.counters.gaps == 0 and r.sub.counters.restarts == 0


async def test_start_bootstraps_the_history_published_before_we_subscribed() -> None:
    """A router (re)started after the engine: everything still in the engine's buffer is applied at once."""
    ctx = zmq.asyncio.Context()
    index = MemoryPrefixIndex()
    ingest = Ingest(index, lambda _e: HashScheme())
    sub = KvEventSubscriber(ingest, options=OPTIONS, context=ctx)
    pub = FakePublisher(ctx)
    try:
        pub.start()
        await pub.publish(batch(stored(0, 3)))  # nobody listening: only the replay buffer has these
        await pub.publish(batch(stored(3, 2)))
        await pub.publish(batch(removed(4)))
        sub.add(EventSource(E, pub.pub_address, pub.replay_address))
        await until(lambda: sub.counters.bootstraps == 1 and index.entries(E) == 4, what="bootstrap")
        status = sub.status(E)
        assert status is not None and status.last_seq == 2 and not status.cold
        assert sub.counters.bootstraps_complete == 1
    finally:
        await sub.close()
        await pub.close()
        ctx.destroy(linger=0)


async def test_bootstrap_with_a_rolled_over_buffer_applies_only_the_tail() -> None:
    ctx = zmq.asyncio.Context()
    index = MemoryPrefixIndex()
    ingest = Ingest(index, lambda _e: HashScheme())
    sub = KvEventSubscriber(ingest, options=OPTIONS, context=ctx)
    pub = FakePublisher(ctx)
    try:
        pub.start()
        await pub.publish(batch(stored(0, 3)))
        await pub.publish(batch(stored(3, 2)))
        pub.forget(0)  # the buffer no longer holds the start of the history
        sub.add(EventSource(E, pub.pub_address, pub.replay_address))
        await until(lambda: sub.counters.bootstraps == 1 and index.entries(E) == 2, what="bootstrap")
        assert sub.counters.bootstraps_complete == 0
        assert index.match_sync(ALL[3:], [E]) == {E: 2}  # the tail's blocks, nothing invented
        status = sub.status(E)
        assert status is not None and status.last_seq == 1
    finally:
        await sub.close()
        await pub.close()
        ctx.destroy(linger=0)


async def test_remove_clears_the_endpoint() -> None:
    async with rig() as r:
        await r.pub.publish(batch(stored(0, 3)))
        await r.settle()
        await r.sub.remove(E)
        assert r.held() == 0 and r.sub.status(E) is None


async def test_random_stream_with_drops_ends_in_the_same_state_as_the_engine() -> None:
    """300 batches of stores/removes, ~10% dropped on the PUB side: replay must make the index exact."""
    import random

    rng = random.Random(7)
    async with rig() as r:
        held: set[int] = set()
        for _ in range(300):
            if rng.random() < 0.6 or not held:
                first = rng.randrange(0, len(HASHES) - 4)
                payload, change = batch(stored(first, 4)), ("add", HASHES[first : first + 4])
            else:
                block = HASHES.index(rng.choice(sorted(held)))
                payload, change = batch(removed(block)), ("del", [HASHES[block]])
            if rng.random() < 0.1:
                r.pub.drop(payload)
            else:
                await r.pub.publish(payload)
            held = held | set(change[1]) if change[0] == "add" else held - set(change[1])
        await r.pub.publish(batch())  # a final live message so that a trailing drop is noticed
        await r.settle()
        assert r.sub.counters.replay_failures == 0 and r.sub.counters.gaps > 5
        assert r.index.endpoints() == {E} and r.index.entries(E) == len(held)
        for h in HASHES:
            assert (r.index.match_sync([BlockHash(h)], [E]) == {E: 1}) == (h in held)


async def follow_until(pub: FakePublisher, sub: KvEventSubscriber, cond: Callable[[], bool]) -> None:
    """Start ``pub``, follow it, and publish small stores until ``cond`` holds (ZMQ's slow joiner; bounded)."""
    pub.start()
    sub.add(EventSource(E, pub.pub_address, pub.replay_address))
    for _ in range(300):
        await pub.publish(batch(stored(0, 2)))
        await asyncio.sleep(0.02)
        if cond():
            return


class NotTheWriter:
    """A ``WriteGate`` whose lease another replica holds (or nobody yet): this replica never writes. ``shared``
    is what the shared index holds for the endpoint; ``asked`` counts the subscriber's looks at it."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared
        self.asked = 0

    def follow(self, endpoint: EndpointId) -> None: ...
    async def unfollow(self, endpoint: EndpointId) -> None: ...
    def hearing(self, endpoint: EndpointId, connected: bool) -> None: ...
    def take(self, endpoint: EndpointId) -> bool:
        return False

    def is_writer(self, endpoint: EndpointId) -> bool:
        return False

    async def position(self, endpoint: EndpointId) -> Position | None:
        return self.shared.position

    async def shared_state(self, endpoint: EndpointId) -> SharedState | None:
        self.asked += 1
        return self.shared

    async def applied(self, endpoint: EndpointId, seq: int, payload: bytes) -> None: ...


class SkippedWrites:
    """The fenced view of the shared index as a replica that is not the writer sees it."""

    async def store(self, endpoint: EndpointId, hashes: object, *, ttl_s: object = None, chain: object = None) -> bool:
        return False

    async def remove(self, endpoint: EndpointId, hashes: object) -> bool:
        return False

    async def clear(self, endpoint: EndpointId) -> bool:
        return False


async def test_a_purge_only_another_replica_can_write_leaves_the_endpoint_unconfirmed_until_in_step() -> None:
    """The replicas' F4: after a reconnect this replica's purge did not reach the shared index, which may still
    hold the old engine's blocks; the endpoint is precise here only once the shared index holds a batch this
    replica received from the engine since (or nothing at all)."""
    ctx = zmq.asyncio.Context()
    gate = NotTheWriter(SharedState(Position(3, b"old engn"), entries=40))  # the old engine's, untouched
    ingest = Ingest(SkippedWrites(), lambda _e: HashScheme())
    sub = KvEventSubscriber(ingest, options=OPTIONS, context=ctx, gate=gate)
    pub = FakePublisher(ctx)
    try:
        await follow_until(pub, sub, lambda: (s := sub.status(E)) is not None and s.last_seq is not None)
        status = sub.status(E)
        assert status is not None and status.connected and status.trusted and not status.cold
        assert not status.confirmed and not sub.is_precise(E) and sub.precise_endpoints() == frozenset()
        asked = gate.asked
        await until(lambda: gate.asked >= asked + 2, what="two more looks at the shared index")
        assert not sub.is_precise(E), "a position of another engine process proves nothing"
        payload = batch(stored(0, 3), ts=7.0)
        seq = await pub.publish(payload)
        await until(lambda: (s := sub.status(E)) is not None and s.last_seq == seq, what=f"seq {seq}")
        gate.shared = SharedState(Position(seq, digest(payload)), entries=40)  # the writer applied it
        await until(lambda: sub.is_precise(E), what="confirmed by the writer's position")
        assert sub.precise_endpoints() == frozenset({E})
    finally:
        await sub.close()
        await pub.close()
        ctx.destroy(linger=0)


async def test_an_empty_shared_index_confirms_at_once() -> None:
    ctx = zmq.asyncio.Context()
    gate = NotTheWriter(SharedState(None, entries=0))  # nothing there: no phantom is possible
    sub = KvEventSubscriber(Ingest(SkippedWrites(), lambda _e: HashScheme()), options=OPTIONS, context=ctx, gate=gate)
    pub = FakePublisher(ctx)
    try:
        await follow_until(pub, sub, lambda: sub.is_precise(E))
        assert sub.is_precise(E)
    finally:
        await sub.close()
        await pub.close()
        ctx.destroy(linger=0)


async def test_a_batch_is_read_on_arrival_or_at_the_round(reading: bool) -> None:
    """On arrival, a batch is applied at once. Paced, an arrival wakes nothing: the batch is applied when
    ``pace`` is called (a scrape round), here long before the stream's own poll interval (5 s) would look."""
    async with rig(options=replace(OPTIONS, poll_interval_s=5.0)) as r:
        # The warm-up's settle can return while the stream still bootstraps (a replay, awaited), and a stream
        # that is busy looks once more before it waits: it would read what came meanwhile. One more batch, read
        # through to the end (in memory nothing in its handling yields), leaves the stream waiting.
        await r.pub.publish(batch())
        await r.settle()
        await r.pub.publish(batch(stored(0, 3)))
        if reading:
            await asyncio.sleep(0.3)
            assert r.held() == 0  # arrived, not read
            r.sub.pace()
        await until(lambda: r.held() == 3, what="applied")


@contextlib.asynccontextmanager
async def live_pub_sub() -> AsyncIterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    """A PUB and a SUB socket on loopback, the subscription live (ZMQ's slow joiner) and nothing left to read."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    pub, sub = ctx.socket(zmq.PUB), ctx.socket(zmq.SUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        for _ in range(300):  # publish until the subscription is live
            pub.send(b"hello")
            await asyncio.sleep(0.02)
            if has_message(sub):
                break
        while has_message(sub):
            sub.recv(zmq.NOBLOCK)
        yield pub, sub
    finally:
        pub.close(linger=0)
        sub.close(linger=0)
        ctx.term()


def has_message(sock: zmq.Socket[bytes]) -> bool:
    return bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


async def test_a_stream_socket_wakes_its_reader_once_per_arrival_not_on_every_loop_turn() -> None:
    """``_Readable`` takes the ZMQ FD's signal down in its callback: while nobody waits (the stream's loop is
    busy applying a batch), an arrival must not make the event loop call it again on every turn."""

    class Counted(_Readable):
        looks = 0

        def _look(self, sock: zmq.Socket[bytes]) -> None:
            Counted.looks += 1
            super()._look(sock)

    async with live_pub_sub() as (pub, sub):
        readable = Counted((sub,))
        try:
            Counted.looks = 0
            pub.send(b"while busy")
            await asyncio.sleep(0.2)  # nobody waits: the loop turns freely
            assert 1 <= Counted.looks <= 3, Counted.looks
            assert await readable.wait(1.0) == [sub]
        finally:
            readable.close()


async def test_a_paced_round_wakes_a_stream_only_for_a_message_or_its_poll() -> None:
    """Paced: a round (``_Readable.pace``) wakes the waiter when a socket has a message, or when its poll is due;
    a stream with nothing to read sleeps through the rounds between (each wake is a task step for nothing)."""
    async with live_pub_sub() as (pub, sub):
        readable = _Readable((sub,), watched=())  # paced: the SUB socket is not watched

        async def woken_by(now_s: float, *, news: bool = False) -> bool:
            waiter = asyncio.ensure_future(readable.wait(10.0))
            await asyncio.sleep(0)  # the waiter is waiting (it looked: nothing yet)
            if news:  # arrives while it waits: an unwatched socket wakes nobody
                pub.send(b"news")
                await until(lambda: has_message(sub), what="the message in")
                await asyncio.sleep(0.05)
                assert not waiter.done()
            readable.pace(now_s, every_s=0.5)
            await asyncio.sleep(0.05)
            woken = waiter.done()
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            return woken

        try:
            assert await woken_by(100.0), "the first round polls"
            assert not await woken_by(100.1), "nothing to read, poll not due: asleep"
            assert await woken_by(100.2, news=True), "a message waiting wakes it"
            sub.recv(zmq.NOBLOCK)
            assert not await woken_by(100.6), "the poll counts from the last wake"
            assert await woken_by(100.7), "the poll is due"
        finally:
            readable.close()


async def test_without_a_poll_a_round_wakes_a_stream_only_for_a_message_and_holds_off_its_own_timer() -> None:
    """Paced without a write gate (no poll: ``every_s`` None), a round wakes the waiter only when its socket
    has a message. The waiter's own timer is the fallback for when rounds stop: each round pushes it back, so
    while rounds run it never wakes the process on its own."""
    async with live_pub_sub() as (pub, sub):
        readable = _Readable((sub,), watched=())
        waiter = asyncio.ensure_future(readable.wait(1.0))
        try:
            await asyncio.sleep(0)
            for i in range(40):  # 2 s of rounds: twice the waiter's own timeout
                readable.pace(100.0 + i / 20, every_s=None)
                await asyncio.sleep(0.05)
                assert not waiter.done(), f"woken at round {i} with nothing to read"
            pub.send(b"news")
            await until(lambda: has_message(sub), what="the message in")
            readable.pace(102.0, every_s=None)
            assert await asyncio.wait_for(waiter, 5.0) == [sub]
            sub.recv(zmq.NOBLOCK)
            started_s = time.monotonic()
            assert await readable.wait(0.3) == []  # no rounds: its own timer ends the wait
            assert time.monotonic() - started_s >= 0.25
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
            readable.close()
