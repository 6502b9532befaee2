"""ZMQ subscriber for vLLM KV events: one SUB per endpoint, applied in order through ``Ingest``.

Per endpoint (one task, so its batches are applied strictly in order)::

    socket (re)connected     -> purge (we cannot know what we missed), then bootstrap: replay from seq 0;
                                if the engine still buffers its whole history (first replayed seq is 0,
                                or nothing was ever published) the index is rebuilt exactly and the endpoint
                                is warm at once; otherwise the replayed tail is applied (an under-estimate:
                                cold until a store lands, as after any purge)
    first message            -> baseline sequence number (when no bootstrap set one)
    seq <= bootstrap's last  -> already applied by the bootstrap replay: skipped
    seq == last + 1          -> apply
    seq <= last              -> the engine restarted (it counts from 0 again): purge, bootstrap, apply
    seq >  last + 1          -> gap: DEALER replay of [last+1, seq) from the engine's ROUTER, then apply;
                                no replay endpoint, timeout, or an incomplete replay (the buffer no longer
                                holds the start) -> purge, apply the replayed tail, apply
    bad frames / payload     -> counted, logged (rate-limited), skipped; the stream carries on

With a ``WriteGate`` (``gate.py``; ``extproc/redis/leases.py``: replicas sharing a Redis index), only the endpoint's
writer writes; the others run the same loop with their index writes skipped. On becoming the writer (and on
reconnecting as it) the stream resumes instead (``_resume``): replay from the stored last applied batch and
apply what follows it; if that batch is gone or differs (engine restarted), purge and bootstrap as above.
After each applied batch (or replayed run) the writer stores its seq as the position. The loop tells the
gate whether it hears the engine: only a replica that does holds the lease.

**Confirmed** (with a gate): a purge this replica could not write (another replica writes the endpoint, or
nobody does yet: a backend down past the lease ttl lost its holder) leaves the shared index as the writer left
it, possibly full of the old engine's blocks. The endpoint is then not precise here until the shared index is
known to be in step with the engine this replica hears: it holds nothing for the endpoint, or its stored
position is a batch this replica received from the engine since the purge (``gate.in_step``, checked each
tick), or this replica becomes the writer and resumes. Until then it is routed on our own guesses.

"Purge" = clear the endpoint's index entries and mark it cold until events refill it (``Ingest.purge``).
Applying only a *tail* of an engine's history never invents blocks (``replay.contiguous_tail``), so partial
replays are applied rather than thrown away.

Modes: ``connect`` (we dial each engine's PUB, the usual case) or ``bind`` (we bind and the engine dials us;
vLLM connects when its endpoint has no ``*``). The replay socket is always the engine's, so we always dial it.

Reading: by default a message wakes the event loop as it arrives (a reader on the SUB socket's ``ZMQ_FD``).
``paced`` (the picker's default, ``scrape.paced_kv_events``): the SUB socket is not watched; each stream reads
what arrived when ``pace`` is called (once per scrape round, by the scraper's ticker, in the wake-up the round
costs anyway). A round wakes only the streams with a message waiting (with a write gate, also each other one
once per poll interval: the gate's tick); a stream's own timer (``_PACED_FALLBACK_TICKS`` poll intervals after
the last round) fires only when rounds stop. Order, gaps, replays and leases are unchanged: only when a stream
looks is. Connection changes (the monitor socket) still wake it at once.

The loop owns its sockets: on any unexpected error it logs, closes them, backs off and starts over (which
counts as a reconnect). Every wait is bounded: polls tick every ``poll_interval_s`` and a replay gives up
after ``replay_timeout_s`` or ``replay_max_batches``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from extproc.kvcache import replay
from extproc.kvcache.events import EventDecodeError, ReplayItem, decode_batch, parse_frames
from extproc.kvcache.gate import WriteGate, digest, in_step
from extproc.kvcache.ingest import Ingest, Outcome
from extproc.tasks import stop_task
from extproc.types import EndpointId

log = logging.getLogger(__name__)

_MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_UP = (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED)
_GATE_TICK_S = 0.1  # with a WriteGate, the poll tick: how soon an idle stream notices it became the writer
_PACED_FALLBACK_TICKS = 3  # paced: a stream's own wait times out after this many poll ticks (rounds stopped)


@dataclass(frozen=True, slots=True)
class EventSource:
    """Where one endpoint's events come from: ``address`` of its PUB (or ours, with ``bind``)."""

    endpoint: EndpointId
    address: str  # "tcp://10.0.0.7:5557"; with bind=True e.g. "tcp://0.0.0.0:5557" or "tcp://127.0.0.1:*"
    replay_address: str | None = None  # the engine's ROUTER, e.g. "tcp://10.0.0.7:6557"
    bind: bool = False
    topic: str = ""  # subscription prefix (vLLM's default topic is "")


@dataclass(frozen=True, slots=True)
class SubscriberOptions:
    """Tuning knobs; the defaults suit vLLM's publisher defaults (buffer_steps=10000, hwm=100000)."""

    replay_timeout_s: float = 2.0
    replay_max_batches: int = 20_000
    poll_interval_s: float = 0.5
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    rcvhwm: int = 100_000
    heartbeat_ivl_ms: int = 2_000  # ZMTP heartbeats notice a silently dead peer
    warn_every_s: float = 30.0
    # True: a message does not wake the event loop; each stream reads what arrived when ``pace()`` is called
    # (once per scrape round, in the wake-up that round costs anyway), and, with a write gate, polls once per
    # ``poll_interval_s`` in a round (on its own timer 3 of them after the last round, should rounds stop).
    # Connection changes still wake it at once.
    paced: bool = False


@dataclass(frozen=True, slots=True)
class StreamStatus:
    """What the router needs to know about one endpoint's event stream."""

    connected: bool
    trusted: bool  # its hashes passed the self-check (or were never contradicted)
    cold: bool  # purged or cleared and not refilled yet: "no prefix" is not a fact
    last_seq: int | None
    last_event_s: float | None  # monotonic time of the last applied batch; None = never
    writer: bool = True  # this replica writes its events to the index (False: another replica's lease)
    confirmed: bool = True  # the shared index is known to be in step with this engine (module docstring)


@dataclass
class StreamCounters:
    """Transport totals over every endpoint (ingest keeps its own: ``Ingest.counters``)."""

    messages: int = 0
    bad_frames: int = 0
    decode_errors: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0  # timeout, error, or incomplete: each ends in a purge
    replayed_batches: int = 0
    bootstraps: int = 0  # replays from seq 0 after a (re)connect
    bootstraps_complete: int = 0  # ... that found the engine's whole history
    duplicates: int = 0  # live messages the bootstrap had already applied
    restarts: int = 0  # sequence went backwards
    reconnects: int = 0
    loop_errors: int = 0
    takeovers: int = 0  # became the writer, or reconnected as it (with or without a stored position)
    resumes: int = 0  # ... and carried on from the stored position
    resume_failures: int = 0  # ... but no position, engine restarted or history gone: purge + bootstrap


@dataclass
class _Stream:
    source: EventSource
    last_seq: int | None = None  # -1: an empty history was bootstrapped, the next message must be seq 0
    skip_through: int | None = None  # live messages up to this seq were already applied by the bootstrap
    connections: int = 0
    ever_connected: bool = False
    last_event_s: float | None = None
    bound_address: str | None = None
    next_warn_s: float = 0.0
    # None: confirmed. Else seq -> digest of the batches received since a purge this replica could not write.
    unconfirmed: dict[int, bytes] | None = None
    next_check_s: float = 0.0  # when to look at the shared index again while unconfirmed
    committable: bool = True  # the last apply or purge reached the index: its position may be stored
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def _has_message(sock: zmq.Socket[bytes]) -> bool:
    """A message can be read from ``sock`` without waiting (``ZMQ_EVENTS``; a system call or two)."""
    return bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


class _Readable:
    """Which of a stream's sockets have a message, waking the loop through a reader on each ``watched`` socket's
    ``ZMQ_FD`` kept for the sockets' life (default: all of them). zmq.asyncio's Poller builds futures, callbacks
    and a timer per call and takes one more turn of the loop: on this kind of VM ~100-200 of the 300-550 us of
    CPU a message cost (``bench/results/events-cost/notes.md``). The FD is edge-triggered and only says "look":
    ``ZMQ_EVENTS`` is read after the signal is cleared, so a message arriving between the two still wakes the
    next wait. A socket not watched is looked at in each ``pace`` round, and when a wait times out."""

    def __init__(
        self, sockets: tuple[zmq.Socket[bytes], ...], watched: tuple[zmq.Socket[bytes], ...] | None = None
    ) -> None:
        self._sockets = sockets
        self._loop = asyncio.get_running_loop()
        self._signal = asyncio.Event()
        self._paced_s = float("-inf")  # when ``pace`` last woke the waiter
        self._waiting: tuple[asyncio.Timeout, float] | None = None  # while ``wait`` waits: its deadline, timeout
        watched = sockets if watched is None else watched
        self._idle = [s for s in sockets if s not in watched]  # not watched: what ``pace`` looks at
        self._fds = [int(s.getsockopt(zmq.FD)) for s in watched]
        for fd, sock in zip(self._fds, watched, strict=True):
            self._loop.add_reader(fd, self._look, sock)

    def pace(self, now_s: float, every_s: float | None) -> None:
        """The paced reading's round: wake the waiter when a socket it does not watch has a message, or when it was
        last woken here ``every_s`` ago or more (its poll, in a wake-up the round costs anyway; None: no poll). A
        stream with nothing to read is not woken each round: four streams ten times a second were ~5% of an idle
        picker's CPU (``bench/results/paced-streams``). A watched socket is not looked at: its message wakes the
        waiter itself (``_look``), and each look is a system call or two."""
        polled = every_s is not None and now_s - self._paced_s >= every_s
        if polled or any(_has_message(s) for s in self._idle):
            self._paced_s = now_s
            self._signal.set()
        elif self._waiting is not None:  # its own timer is for when rounds stop: while they run, it never fires
            deadline, timeout_s = self._waiting
            now = self._loop.time()
            when = deadline.when()
            # pushed back only once half of it has run: each push leaves a cancelled timer in the loop's heap
            if when is not None and when - now < timeout_s / 2:
                deadline.reschedule(now + timeout_s)

    def _look(self, sock: zmq.Socket[bytes]) -> None:
        """The FD is readable: wake the waiter. Reading ``ZMQ_EVENTS`` here takes the FD's signal down;
        left up, the loop would call this again on every turn while the waiter is busy elsewhere (an
        index write awaiting Redis, say): a spin."""
        sock.getsockopt(zmq.EVENTS)
        self._signal.set()

    def _ready(self) -> list[zmq.Socket[bytes]]:
        return [s for s in self._sockets if _has_message(s)]

    async def wait(self, timeout_s: float) -> list[zmq.Socket[bytes]]:
        """The sockets a message can be read from without waiting; empty after ``timeout_s`` with none."""
        self._signal.clear()
        ready = self._ready()
        if ready:
            return ready
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s) as deadline:
                    self._waiting = (deadline, timeout_s)
                    await self._signal.wait()
        finally:
            self._waiting = None
        return self._ready()

    def close(self) -> None:
        for fd in self._fds:
            self._loop.remove_reader(fd)


class KvEventSubscriber:
    """One background task per endpoint: ``add``/``remove`` endpoints, read ``status``, ``close`` at exit."""

    def __init__(
        self,
        ingest: Ingest,
        *,
        options: SubscriberOptions | None = None,
        context: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        gate: WriteGate | None = None,
    ) -> None:
        self.ingest = ingest
        self.gate = gate
        self.options = options or SubscriberOptions()
        self.counters = StreamCounters()
        self._own_context = context is None
        self._ctx = context or zmq.asyncio.Context()
        # The SUB and monitor sockets are plain ones on the same context, read when ``_Readable`` says so (the
        # replay DEALERs stay asyncio sockets: they await answers under a timeout).
        self._plain_ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(self._ctx.underlying)
        self._clock = clock
        self._streams: dict[EndpointId, _Stream] = {}
        # with options.paced: {a stream's reader: its poll tick, s (None: no poll)}
        self._paced: dict[_Readable, float | None] = {}

    def add(self, source: EventSource) -> None:
        """Start following ``source`` (to replace an endpoint's source, ``remove`` it first)."""
        if source.endpoint in self._streams:
            raise ValueError(f"already subscribed to {source.endpoint}")
        stream = _Stream(source)
        if self.gate is not None:
            self.gate.follow(source.endpoint)
        stream.task = asyncio.create_task(self._run(stream), name=f"kv-events:{source.endpoint}")
        self._streams[source.endpoint] = stream

    async def remove(self, endpoint: EndpointId, *, clear: bool = True) -> None:
        """Stop following ``endpoint``; with ``clear``, also drop its index entries (it left the pool)."""
        stream = self._streams.pop(endpoint, None)
        if stream is None:
            return
        await stop_task(stream.task)
        if clear:
            await self.ingest.purge(endpoint, "endpoint removed")  # the stream is gone: nothing to confirm
        self.ingest.forget(endpoint)
        if self.gate is not None:
            await self.gate.unfollow(endpoint)

    def pace(self) -> None:
        """With ``options.paced``: every stream with a message waiting reads what arrived since its last look
        (applied in this turn of the event loop); one that has none is woken only for its poll, at most every
        poll tick. Call it once per scrape round. A no-op otherwise."""
        now_s = self._clock()
        for readable, tick_s in self._paced.items():
            readable.pace(now_s, tick_s)

    def status(self, endpoint: EndpointId) -> StreamStatus | None:
        """The endpoint's stream status, or None if it is not followed."""
        stream = self._streams.get(endpoint)
        if stream is None:
            return None
        st = self.ingest.status(endpoint)
        return StreamStatus(
            connected=stream.connections > 0,
            trusted=st.trusted,
            cold=st.cold,
            last_seq=stream.last_seq if stream.last_seq is not None and stream.last_seq >= 0 else None,
            last_event_s=stream.last_event_s,
            writer=self.gate is None or self.gate.is_writer(endpoint),
            confirmed=stream.unconfirmed is None,
        )

    def is_precise(self, endpoint: EndpointId) -> bool:
        """Whether the router may take ``endpoint``'s precise-index entries as the truth: its stream is
        followed and connected, its hashes are trusted, it is not cold, and (with a gate) the shared index is
        confirmed in step with its engine. Otherwise use the approximate index for it."""
        status = self.status(endpoint)
        return status is not None and status.connected and status.trusted and not status.cold and status.confirmed

    def precise_endpoints(self) -> frozenset[EndpointId]:
        """Every endpoint ``is_precise`` holds for, now: the router takes this once per request."""
        return frozenset(e for e in list(self._streams) if self.is_precise(e))

    def follows(self, endpoint: EndpointId) -> bool:
        """Whether ``endpoint``'s events are followed."""
        return endpoint in self._streams

    def has_live_events(self, endpoint: EndpointId) -> bool:
        """Whether ``endpoint``'s stream is followed, connected and trusted, cold or not: what it stores will be
        reported, so the router's own record of a pick there need only bridge the moment until it is."""
        status = self.status(endpoint)
        return status is not None and status.connected and status.trusted

    def bound_address(self, endpoint: EndpointId) -> str | None:
        """In bind mode, the address actually bound (resolves a ``*`` port); None until bound."""
        stream = self._streams.get(endpoint)
        return None if stream is None else stream.bound_address

    async def close(self) -> None:
        """Stop every task and close every socket."""
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await stop_task(stream.task)
        if self._own_context:
            self._ctx.destroy(linger=0)

    # -- the per-endpoint loop -------------------------------------------------------------------------------

    async def _run(self, stream: _Stream) -> None:
        opt = self.options
        backoff = opt.backoff_initial_s
        while True:
            started = self._clock()
            try:
                await self._serve(stream)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.counters.loop_errors += 1
                if self._clock() - started > opt.backoff_max_s:
                    backoff = opt.backoff_initial_s  # it had been healthy: start the backoff over
                log.exception("kv events: %s failed; restarting in %.1fs", stream.source.endpoint, backoff)
            stream.connections = 0
            if self.gate is not None:
                self.gate.hearing(stream.source.endpoint, False)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.options.backoff_max_s)

    async def _serve(self, stream: _Stream) -> None:
        src, opt = stream.source, self.options
        sub = self._plain_ctx.socket(zmq.SUB)
        monitor = sub.get_monitor_socket(_MONITORED)
        readable: _Readable | None = None
        try:
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, opt.rcvhwm)
            sub.setsockopt(zmq.HEARTBEAT_IVL, opt.heartbeat_ivl_ms)
            sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, opt.heartbeat_ivl_ms * 3)
            sub.setsockopt(zmq.SUBSCRIBE, src.topic.encode())
            if src.bind:
                sub.bind(src.address)
                stream.bound_address = sub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                sub.connect(src.address)
            readable = _Readable((monitor, sub), watched=(monitor,) if opt.paced else None)
            tick_s = opt.poll_interval_s if self.gate is None else min(opt.poll_interval_s, _GATE_TICK_S)
            wait_s = tick_s
            if opt.paced:
                # ``pace`` wakes the stream in a round's wake-up: for a message, and with a gate for its poll (the
                # gate's tick; without one a poll finds nothing ``pace`` did not). Its own timer is only the
                # fallback for when rounds stop (each round pushes it back): it never wakes the process apart
                self._paced[readable] = tick_s if self.gate is not None else None
                wait_s = _PACED_FALLBACK_TICKS * tick_s
            while True:
                ready = await readable.wait(wait_s)
                if self.gate is not None:
                    await self._gate_tick(stream)
                if monitor in ready:  # connection changes first: a reconnect purges before new data
                    await self._on_monitor(stream, monitor.recv_multipart(zmq.NOBLOCK))
                elif sub in ready:
                    await self._on_message(stream, sub.recv_multipart(zmq.NOBLOCK))
        finally:
            if readable is not None:
                self._paced.pop(readable, None)
                readable.close()
            with contextlib.suppress(zmq.ZMQError):
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _gate_tick(self, stream: _Stream) -> None:
        """Between batches: tell the gate whether we hear the engine; resume if we just became the writer."""
        assert self.gate is not None
        endpoint = stream.source.endpoint
        self.gate.hearing(endpoint, stream.connections > 0)
        if self.gate.take(endpoint):
            await self._resume(stream)
        elif stream.unconfirmed is not None and stream.connections > 0 and self._clock() >= stream.next_check_s:
            stream.next_check_s = self._clock() + _GATE_TICK_S  # one look per tick, not one per message
            shared = await self.gate.shared_state(endpoint)
            if shared is not None and in_step(shared, stream.unconfirmed):
                stream.unconfirmed = None
                log.info("kv events: %s: the shared index is in step with the engine again", endpoint)

    async def _on_monitor(self, stream: _Stream, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        endpoint = stream.source.endpoint
        if event in _UP:
            stream.connections += 1
            if stream.ever_connected:
                self.counters.reconnects += 1
            reason = "reconnected" if stream.ever_connected else "stream started"
            stream.ever_connected = True
            stream.last_seq, stream.skip_through = None, None  # whatever comes next is a new baseline
            if self.gate is not None and self.gate.is_writer(endpoint):
                await self._resume(stream)
                return
            await self._purge(stream, reason)
            await self._bootstrap(stream)
        elif event == zmq.EVENT_DISCONNECTED:
            stream.connections = max(0, stream.connections - 1)
            log.info("kv events: %s disconnected", endpoint)

    async def _on_message(self, stream: _Stream, frames: list[bytes]) -> None:
        try:
            _topic, seq, payload = parse_frames(frames)
        except EventDecodeError as exc:
            self.counters.bad_frames += 1
            self._warn(stream, "bad frames: %s", exc)
            return
        self.counters.messages += 1
        if stream.skip_through is not None:
            if seq <= stream.skip_through:
                self.counters.duplicates += 1
                return
            stream.skip_through = None
        last = stream.last_seq
        if last is not None and seq <= last:  # a new engine process, counting from 0 again
            self.counters.restarts += 1
            await self._purge(stream, f"sequence went back from {last} to {seq}: engine restart")
            stream.last_seq, stream.skip_through = None, None
            await self._bootstrap(stream)  # what it published before this message
            if stream.skip_through is not None and seq <= stream.skip_through:
                return  # the bootstrap applied this one too
            last = stream.last_seq
        if last is not None and seq > last + 1:
            self.counters.gaps += 1
            await self._recover(stream, last + 1, seq)
        stream.last_seq = seq
        await self._apply(stream, seq, payload)
        await self._commit(stream, seq, payload)

    async def _apply(self, stream: _Stream, seq: int, payload: bytes) -> None:
        seen = stream.unconfirmed
        if seen is not None:  # what the writer's stored position may prove
            seen[seq] = digest(payload)
            if len(seen) > self.options.replay_max_batches:
                del seen[next(iter(seen))]
        try:
            batch = decode_batch(payload)
        except EventDecodeError as exc:
            self.counters.decode_errors += 1
            self._warn(stream, "undecodable batch skipped: %s", exc)
            return
        outcome = await self.ingest.apply(stream.source.endpoint, batch)
        stream.committable = outcome is not Outcome.WRITE_LOST
        stream.last_event_s = self._clock()

    async def _purge(self, stream: _Stream, reason: str) -> None:
        """Purge through ingest. One this replica could not write leaves the endpoint unconfirmed (module
        docstring); one it wrote itself confirms it."""
        outcome = await self.ingest.purge(stream.source.endpoint, reason)
        stream.committable = outcome is not Outcome.WRITE_LOST
        if self.gate is not None and outcome is Outcome.SKIPPED:
            stream.unconfirmed = {}
        elif outcome is Outcome.APPLIED:
            stream.unconfirmed = None

    async def _bootstrap(self, stream: _Stream) -> None:
        """Rebuild the endpoint from the engine's replay buffer, from seq 0 (after a purge)."""
        endpoint, address, opt = stream.source.endpoint, stream.source.replay_address, self.options
        if address is None:
            return
        self.counters.bootstraps += 1
        items = await replay.fetch(
            self._ctx, address, 0, until=None, timeout_s=opt.replay_timeout_s, max_batches=opt.replay_max_batches
        )
        if items is None:
            return
        tail = replay.contiguous_tail(items)
        await self._apply_replayed(stream, tail)
        complete = len(tail) == len(items) and (not items or items[0].seq == 0)
        stream.last_seq = tail[-1].seq if tail else -1 if complete else None
        stream.skip_through = tail[-1].seq if tail else None
        if complete:
            self.counters.bootstraps_complete += 1
            self.ingest.mark_complete(endpoint)
        log.info("kv events: %s bootstrapped %d batches (%s)", endpoint, len(tail),
                 "complete" if complete else "history incomplete: an under-estimate")  # fmt: skip

    async def _recover(self, stream: _Stream, start: int, until: int) -> None:
        """Fill the gap [start, until) by replay; if incomplete, purge and apply the replayed tail."""
        address, opt = stream.source.replay_address, self.options
        if address is None:
            await self._purge(stream, f"gap {start}..{until - 1} and no replay endpoint")
            return
        self.counters.replays += 1
        items = await replay.fetch(
            self._ctx, address, start, until=until, timeout_s=opt.replay_timeout_s, max_batches=opt.replay_max_batches
        )
        tail = [] if items is None else replay.contiguous_tail(items, until)
        if not tail or tail[0].seq != start:
            self.counters.replay_failures += 1
            got = "nothing" if not tail else f"{tail[0].seq}..{tail[-1].seq}"
            await self._purge(stream, f"replay of {start}..{until - 1} incomplete (got {got})")
        await self._apply_replayed(stream, tail)

    async def _apply_replayed(self, stream: _Stream, items: list[ReplayItem]) -> None:
        self.counters.replayed_batches += len(items)
        for item in items:
            await self._apply(stream, item.seq, item.payload)
        if items:
            await self._commit(stream, items[-1].seq, items[-1].payload)

    async def _commit(self, stream: _Stream, seq: int, payload: bytes) -> None:
        """Store ``seq`` as the stream's position (a no-op unless this replica is the writer); not while a
        write failed (a pending purge): a successor must replay from before the lost write."""
        if self.gate is not None and stream.committable:
            await self.gate.applied(stream.source.endpoint, seq, payload)

    async def _resume(self, stream: _Stream) -> None:
        """As the new writer: replay from the stored position's batch (checked by its digest) and apply the
        batches after it; without a matching one, purge and bootstrap as on connect."""
        assert self.gate is not None
        endpoint, address, opt = stream.source.endpoint, stream.source.replay_address, self.options
        self.counters.takeovers += 1
        pos = await self.gate.position(endpoint)
        items = None
        if pos is not None and address is not None:
            items = await replay.fetch(
                self._ctx, address, pos.seq, until=None, timeout_s=opt.replay_timeout_s,
                max_batches=opt.replay_max_batches,
            )  # fmt: skip
        tail = [] if items is None else replay.contiguous_tail(items)
        if pos is not None and tail and pos.matches(tail[0].seq, tail[0].payload):
            self.counters.resumes += 1
            stream.unconfirmed = None  # the stored position is a batch of this very engine
            await self._apply_replayed(stream, tail[1:])
            stream.last_seq = stream.skip_through = tail[-1].seq
            log.info("kv events: %s: writer from seq %d, replayed %d batches", endpoint, pos.seq, len(tail) - 1)
            return
        if pos is not None:
            self.counters.resume_failures += 1
        stream.last_seq, stream.skip_through = None, None
        why = "no stored position" if pos is None else f"seq {pos.seq} not replayable from this engine"
        await self._purge(stream, f"new writer, {why}")
        await self._bootstrap(stream)

    def _warn(self, stream: _Stream, msg: str, *args: object) -> None:
        now = self._clock()
        if now >= stream.next_warn_s:
            stream.next_warn_s = now + self.options.warn_every_s
            log.warning("kv events: %s: " + msg, stream.source.endpoint, *args)
