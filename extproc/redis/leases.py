"""Leases with fencing: each endpoint's KV-event stream is applied to the shared index by one replica at a time.

Every replica follows every endpoint's stream (so it knows each endpoint's status and can take over at once),
but only the endpoint's **writer**, the replica holding its lease, writes to the shared index; the others'
writes are skipped (their own approximate index still follows purges). Keys (``lease:<e>``, ``stream:<e>``)
are in ``schema.py``; the scripts in ``lua/lease_*.lua``::

    ACQUIRE  nobody holds lease:<e>  -> token = HINCRBY stream:<e> fence 1; HSET lease:<e> owner token; PEXPIRE ttl
             (a missing counter starts at the server's time in ms, so tokens grow even across Redis data loss)
             we hold it already      -> our token again, PEXPIRE ttl (we had lost track of it)
    RENEW    lease token == ours     -> PEXPIRE ttl                       (every ttl/3)
    RELEASE  lease token == ours     -> DEL lease:<e>                     (unfollow, shutdown: instant failover)
    COMMIT   lease token == ours     -> HSET stream:<e> seq digest        (after each applied batch or replay)
    POSITION                         -> stream:<e> seq digest, HLEN h:<e> (a new writer's resume; a replica
                                        that is not the writer confirming the shared index is in step)

**Fencing.** Every index write made for the stream (store/remove/clear from ingest, purges included) carries
the writer's token; the write script itself compares it with ``lease:<e>``'s (``common.lua``'s ``fenced``), so a
deposed owner (paused past its ttl, partitioned) changes nothing: ``FencedOut``, counted, and it stops writing.

**Only a replica that hears the engine competes**: the subscriber reports its stream's connection
(``hearing``); a replica not connected never acquires, and a holder that stays deaf for a ttl releases the
lease (a partition, an engine gone), so it cannot sit on a lease while replicas that hear the engine skip.

**Timings** (``ttl_s`` = 2): the holder renews every ttl/3; others try to acquire every ``ttl/10`` (the tick).
A dead holder's lease expires within ttl of its last renewal; another replica takes it at its next tick and
its stream task adopts it at its next message or poll tick (0.1 s with a gate): at most about ttl + 0.3 s
(2.3 s), plus the replay. A clean shutdown releases, so failover then takes a tick.
A holder counts itself the writer only until *the time it sent its last successful renewal* + ttl, before the
server's expiry; the fencing check covers whatever slips between the two.

**Takeover** (the subscriber's ``_resume``): the new writer reads ``stream:<e>``'s position (seq, digest) and
replays from *seq* itself through the engine's ROUTER: a first item with that seq and digest proves the same
engine process (a restarted engine counts from 0 again), and the items after it are applied; anything else (no
position, a restarted engine, a rolled-over buffer, no replay) purges and bootstraps as on connect.

**No double-apply**: a new writer never applies a batch at or below the stored seq. The commit follows the
batch's writes (one more round trip); a writer dying between the two makes its successor apply that batch
again, which leaves the same index: store/remove/clear re-applied in order set each block as the last event
touching it does. A writer that stopped writing for any reason (lost, expired, fenced out) goes through a
resume again before it next writes, so batches it skipped meanwhile are replayed, not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extproc.kvcache.gate import IndexWrites, Position, SharedState, digest
from extproc.kvcache.index import Chain, IndexUnavailable
from extproc.redis.client import RedisClient, call_within
from extproc.redis.prefix_index import FencedOut
from extproc.redis.schema import Schema
from extproc.redis.scripts import source
from extproc.tasks import stop_task
from extproc.types import BlockHash, EndpointId

log = logging.getLogger(__name__)

_SCRIPTS = ("acquire", "renew", "release", "commit", "position")  # lua/lease_<name>.lua


class FencedIndex(Protocol):
    """An index whose writes can be fenced by a lease token (``RedisPrefixIndex``): FencedOut when the token is
    not the endpoint's current lease token."""

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
        fence: int | None = None,
    ) -> None: ...

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, fence: int | None = None) -> None: ...

    async def clear(self, endpoint: EndpointId, *, fence: int | None = None) -> None: ...


@dataclass
class LeaseCounters:
    """Totals over every endpoint since start (exported as ``router_kv_lease_*``)."""

    acquired: int = 0
    lost: int = 0  # renewal refused, local expiry, or a fenced-out write
    released: int = 0
    renewals: int = 0
    renew_failures: int = 0  # Redis errors while renewing (retried each tick until the lease runs out)
    acquire_failures: int = 0  # Redis errors while trying to acquire
    fenced_writes: int = 0  # index writes or commits the server refused: we had been deposed
    skipped_writes: int = 0  # index writes not made because this replica is not the writer
    commits: int = 0
    commit_failures: int = 0


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    writer: bool  # adopted by the stream task: its writes go to the shared index
    token: int | None  # the token held (maybe not adopted yet)
    valid_for_s: float  # how long the lease is still ours by the local clock (0 when not held)


@dataclass
class _Lease:
    token: int | None = None  # held, as of the last acquire/renew
    valid_until: float = 0.0  # local monotonic time: (sent of the last successful acquire/renew) + ttl
    renew_at: float = 0.0
    adopted: int | None = None  # the token the stream's task writes with (changed only between batches)
    deaf_since: float | None = 0.0  # since when its stream has not been connected (None: connected)


class StreamLeases:
    """The leases of the endpoints this replica follows, kept by one background task (``start``/``close``)."""

    def __init__(
        self,
        client: RedisClient,
        owner: str,
        *,
        namespace: str = "kvidx",
        ttl_s: float = 2.0,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``client``: usually the prefix index's own (the same namespace); ``timeout_s``: per Redis call."""
        self.counters = LeaseCounters()
        self.owner = owner
        self.ttl_s = ttl_s
        self._schema = Schema(namespace)
        self._timeout_s = timeout_s
        self._clock = clock
        self._leases: dict[EndpointId, _Lease] = {}
        self._r = client
        self._scripts = {name: client.register_script(source(f"lease_{name}")) for name in _SCRIPTS}
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the keeper task (acquires and renews every followed endpoint's lease)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kv-event-leases")

    async def close(self, *, release: bool = True) -> None:
        """Stop the keeper and release every lease held (call after the stream tasks are stopped). Without
        ``release`` the leases are left to expire, as after a crash (tests)."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        for endpoint in list(self._leases):
            if release:
                await self.unfollow(endpoint)
            else:
                self._leases.pop(endpoint)

    def writes(self, index: FencedIndex) -> IndexWrites:
        """``index`` as this replica's ingest must write it: fenced by the adopted token; skipped (False) when
        not the writer or fenced out."""
        return _FencedWrites(index, self)

    # -- WriteGate --------------------------------------------------------------------------------------------

    def follow(self, endpoint: EndpointId) -> None:
        self._leases.setdefault(endpoint, _Lease(deaf_since=self._clock()))

    def hearing(self, endpoint: EndpointId, connected: bool) -> None:
        lease = self._leases.get(endpoint)
        if lease is None:
            return
        if connected:
            lease.deaf_since = None
        elif lease.deaf_since is None:
            lease.deaf_since = self._clock()

    async def unfollow(self, endpoint: EndpointId) -> None:
        lease = self._leases.pop(endpoint, None)
        if lease is not None and lease.token is not None:
            await self._release(endpoint, lease, "unfollowed")

    def take(self, endpoint: EndpointId) -> bool:
        lease = self._leases.get(endpoint)
        if lease is None:
            return False
        held = lease.token if self._clock() < lease.valid_until else None
        if held == lease.adopted:
            return False
        lease.adopted = held
        if held is None:
            log.warning("kv leases: %s: no longer its writer", endpoint)
        return held is not None

    def is_writer(self, endpoint: EndpointId) -> bool:
        lease = self._leases.get(endpoint)
        return lease is not None and lease.adopted is not None and self._valid(lease, lease.adopted)

    async def position(self, endpoint: EndpointId) -> Position | None:
        try:
            seq, dig, _entries = await self._run_script("position", endpoint, [])
        except IndexUnavailable as exc:
            log.warning("kv leases: reading %s's position failed: %s", endpoint, exc)
            return None
        return None if seq is None or dig is None else Position(int(seq), bytes(dig))

    async def shared_state(self, endpoint: EndpointId) -> SharedState | None:
        try:
            seq, dig, entries = await self._run_script("position", endpoint, [])
        except IndexUnavailable as exc:
            log.debug("kv leases: reading %s's shared state failed: %s", endpoint, exc)
            return None
        position = None if seq is None or dig is None else Position(int(seq), bytes(dig))
        return SharedState(position, int(entries))

    async def applied(self, endpoint: EndpointId, seq: int, payload: bytes) -> None:
        token = self.write_token(endpoint)
        if token is None:
            return
        try:
            ok = await self._run_script("commit", endpoint, [token, seq, digest(payload)])
        except IndexUnavailable as exc:  # the position lags: a successor replays more (idempotent)
            self.counters.commit_failures += 1
            log.debug("kv leases: committing %s seq %d failed: %s", endpoint, seq, exc)
            return
        if ok:
            self.counters.commits += 1
        else:
            self.fenced_out(endpoint)

    # -- used by the fenced view ------------------------------------------------------------------------------

    def write_token(self, endpoint: EndpointId) -> int | None:
        """The token to write with, or None (not the writer). A writer whose lease ran out (or was lost) stops
        here: it must resume again (``take``) before it writes, so what it skips meanwhile is replayed."""
        lease = self._leases.get(endpoint)
        if lease is None or lease.adopted is None:
            return None
        if self._valid(lease, lease.adopted):
            return lease.adopted
        lease.adopted = None
        return None

    def fenced_out(self, endpoint: EndpointId) -> None:
        """The server refused our token: someone else holds the lease (or nobody). Stop writing."""
        self.counters.fenced_writes += 1
        lease = self._leases.get(endpoint)
        if lease is not None and lease.token is not None:
            self._lose(endpoint, lease, "a write was fenced out")
        if lease is not None:
            lease.adopted = None

    def status(self, endpoint: EndpointId) -> LeaseStatus | None:
        lease = self._leases.get(endpoint)
        if lease is None:
            return None
        left = max(0.0, lease.valid_until - self._clock()) if lease.token is not None else 0.0
        return LeaseStatus(writer=self.is_writer(endpoint), token=lease.token, valid_for_s=left)

    # -- the keeper -------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        tick = self.ttl_s / 10
        while True:
            for endpoint in list(self._leases):
                lease = self._leases.get(endpoint)
                if lease is None:
                    continue
                try:
                    await self._tend(endpoint, lease)
                except Exception:  # keep tending the others; this one is retried next tick
                    log.exception("kv leases: tending %s failed", endpoint)
            await asyncio.sleep(tick)

    async def _tend(self, endpoint: EndpointId, lease: _Lease) -> None:
        now = self._clock()
        if lease.token is not None and now >= lease.valid_until:
            self._lose(endpoint, lease, "not renewed in time")
        deaf_s = None if lease.deaf_since is None else now - lease.deaf_since
        if lease.token is None:
            if deaf_s is None:
                await self._acquire(endpoint, lease, now)
        elif deaf_s is not None and deaf_s >= self.ttl_s:
            await self._release(endpoint, lease, f"its stream has been disconnected for {deaf_s:.1f}s")
        elif now >= lease.renew_at:
            await self._renew(endpoint, lease, now)

    async def _acquire(self, endpoint: EndpointId, lease: _Lease, now: float) -> None:
        try:
            token = int(await self._run_script("acquire", endpoint, [self.owner, self._ttl_ms()]))
        except IndexUnavailable:
            self.counters.acquire_failures += 1
            return
        if not token:
            return
        if self._leases.get(endpoint) is not lease:  # unfollowed meanwhile: hand it back at once
            with contextlib.suppress(IndexUnavailable):
                await self._run_script("release", endpoint, [token])
            return
        lease.token = token
        self._extend(lease, now)
        self.counters.acquired += 1
        log.info("kv leases: %s: acquired (token %d) by %s", endpoint, token, self.owner)

    async def _renew(self, endpoint: EndpointId, lease: _Lease, now: float) -> None:
        token = lease.token
        try:
            ok = await self._run_script("renew", endpoint, [token or 0, self._ttl_ms()])
        except IndexUnavailable as exc:
            self.counters.renew_failures += 1
            log.debug("kv leases: renewing %s failed: %s", endpoint, exc)
            return
        if lease.token != token:
            return  # lost meanwhile (a fenced-out write)
        if ok:
            self._extend(lease, now)
            self.counters.renewals += 1
        else:
            self._lose(endpoint, lease, "renewal refused: taken over")

    async def _release(self, endpoint: EndpointId, lease: _Lease, why: str) -> None:
        token, lease.token, lease.adopted = lease.token, None, None  # stop writing first
        try:
            if await self._run_script("release", endpoint, [token or 0]):
                self.counters.released += 1
                log.info("kv leases: %s: released (%s)", endpoint, why)
        except IndexUnavailable as exc:
            log.warning("kv leases: releasing %s failed (it expires in %.1fs): %s", endpoint, self.ttl_s, exc)

    def _extend(self, lease: _Lease, sent: float) -> None:
        lease.valid_until = sent + self.ttl_s
        lease.renew_at = sent + self.ttl_s / 3

    def _lose(self, endpoint: EndpointId, lease: _Lease, why: str) -> None:
        lease.token = None
        self.counters.lost += 1
        log.warning("kv leases: %s: lease lost (%s)", endpoint, why)

    def _valid(self, lease: _Lease, token: int) -> bool:
        return lease.token == token and self._clock() < lease.valid_until

    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))

    async def _run_script(self, name: str, endpoint: EndpointId, args: Sequence[bytes | str | int]) -> Any:
        keys = self._schema.endpoint(endpoint)
        if name in ("renew", "release"):
            names = [keys.lease]
        elif name == "position":
            names = [keys.stream, keys.held]
        else:
            names = [keys.lease, keys.stream]
        call = self._scripts[name](keys=names, args=list(args))
        return await call_within(self._r, call, self._timeout_s, IndexUnavailable)


class _FencedWrites:
    """The shared index as ingest writes it: each write carries the writer's token; False when skipped."""

    def __init__(self, index: FencedIndex, leases: StreamLeases) -> None:
        self._index = index
        self._leases = leases

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
    ) -> bool:
        index = self._index
        return await self._write(endpoint, lambda t: index.store(endpoint, hashes, ttl_s=ttl_s, chain=chain, fence=t))

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> bool:
        return await self._write(endpoint, lambda t: self._index.remove(endpoint, hashes, fence=t))

    async def clear(self, endpoint: EndpointId) -> bool:
        return await self._write(endpoint, lambda t: self._index.clear(endpoint, fence=t))

    async def _write(self, endpoint: EndpointId, op: Callable[[int], Awaitable[None]]) -> bool:
        token = self._leases.write_token(endpoint)
        if token is None:
            self._leases.counters.skipped_writes += 1
            return False
        try:
            await op(token)
        except FencedOut:
            self._leases.fenced_out(endpoint)
            return False
        return True
