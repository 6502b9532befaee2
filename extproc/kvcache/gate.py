"""The write gate: who applies an endpoint's KV-event stream to a shared index (the subscriber's side of it).

``KvEventSubscriber`` takes an optional ``WriteGate``; ``extproc.redis.leases.StreamLeases`` is the one
implementation (leases with fencing in Redis). Without one, the subscriber always writes (one replica).

``IndexWrites`` is how ingest writes: any ``PrefixIndex`` is one (every write lands, or raises
``IndexUnavailable``); the leases' fenced view is another, whose writes answer False when this replica may
not make them (another replica holds the endpoint's lease). ``ObservedWrites`` is a tee in front of either: it
tells ``CacheObserver``s (tenant occupancy, the hot sets) what each engine's cache did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from extproc.kvcache.index import Chain
from extproc.types import BlockHash, EndpointId


def digest(payload: bytes) -> bytes:
    """What identifies a batch beyond its seq (its payload carries the engine's timestamp)."""
    return hashlib.blake2b(payload, digest_size=8).digest()


@dataclass(frozen=True, slots=True)
class Position:
    """The last batch applied to the shared index for one endpoint."""

    seq: int
    digest: bytes

    def matches(self, seq: int, payload: bytes) -> bool:
        """Whether (``seq``, ``payload``) is that batch, from the same engine process."""
        return seq == self.seq and digest(payload) == self.digest


@dataclass(frozen=True, slots=True)
class SharedState:
    """What the shared index holds for one endpoint: its stored position (None: none) and how many blocks."""

    position: Position | None
    entries: int


class IndexWrites(Protocol):
    """Ingest's writes to the precise index. ``None`` or True: written; False: not this replica's to write
    (skipped, counted by the gate). Raises ``IndexUnavailable`` when the write was lost."""

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
    ) -> bool | None: ...

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> bool | None: ...

    async def clear(self, endpoint: EndpointId) -> bool | None: ...


class WriteGate(Protocol):
    """Who applies an endpoint's stream to a shared index; the subscriber calls it from each stream's task."""

    def follow(self, endpoint: EndpointId) -> None:
        """Start competing for ``endpoint``'s lease (when the subscriber starts following it)."""
        ...

    async def unfollow(self, endpoint: EndpointId) -> None:
        """Stop competing; release the lease if held (after the stream's task is stopped)."""
        ...

    def hearing(self, endpoint: EndpointId, connected: bool) -> None:
        """The stream's connection to the engine is up (or down): only a replica hearing it holds the lease."""
        ...

    def take(self, endpoint: EndpointId) -> bool:
        """Called between batches: adopt the lease's current state. True if this replica has just become the
        writer: the caller must resume from ``position`` before applying anything else."""
        ...

    def is_writer(self, endpoint: EndpointId) -> bool:
        """Whether this replica's writes for ``endpoint`` go to the shared index now."""
        ...

    async def position(self, endpoint: EndpointId) -> Position | None:
        """The stored last applied batch (None: none stored, or Redis did not answer)."""
        ...

    async def shared_state(self, endpoint: EndpointId) -> SharedState | None:
        """The stored position and the shared index's block count for ``endpoint`` (None: Redis did not
        answer). A replica that is not the writer asks it to learn whether the writer's index is in step with
        the engine it hears (``KvEventSubscriber``'s "confirmed")."""
        ...

    async def applied(self, endpoint: EndpointId, seq: int, payload: bytes) -> None:
        """Batch ``seq`` is applied (or deliberately skipped): store it as the position, if the writer."""
        ...


def in_step(shared: SharedState, seen: Mapping[int, bytes]) -> bool:
    """Whether the shared index is known to reflect the engine behind ``seen``: it holds nothing for the
    endpoint (no phantom is possible), or its stored position is a batch of that very engine process."""
    pos = shared.position
    return shared.entries == 0 or (pos is not None and seen.get(pos.seq) == pos.digest)


class CacheObserver(Protocol):
    """Something kept to what an engine's cache holds, by the KV events this replica applies."""

    def stored(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None: ...

    def removed(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None: ...

    def cleared(self, endpoint: EndpointId) -> None: ...


class ObservedWrites:
    """An ``IndexWrites`` that tells each observer what the engine stored, removed and cleared, then writes
    ``inner``.

    The observers hear every event this replica applies, whether or not ``inner`` (a fenced shared index)
    takes the write: the engine's cache changed either way, and each observer is this replica's own."""

    def __init__(self, inner: IndexWrites, observers: Sequence[CacheObserver]) -> None:
        self._inner = inner
        self._observers = tuple(observers)

    async def store(self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None,
                    chain: Chain | None = None) -> bool | None:  # fmt: skip
        for o in self._observers:
            o.stored(endpoint, hashes)
        return await self._inner.store(endpoint, hashes, ttl_s=ttl_s, chain=chain)

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> bool | None:
        for o in self._observers:
            o.removed(endpoint, hashes)
        return await self._inner.remove(endpoint, hashes)

    async def clear(self, endpoint: EndpointId) -> bool | None:
        for o in self._observers:
            o.cleared(endpoint)
        return await self._inner.clear(endpoint)
