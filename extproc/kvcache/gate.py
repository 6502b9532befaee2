"""The write gate: who applies an endpoint's KV-event stream to a shared index (the subscriber's side of it).

``KvEventSubscriber`` takes an optional ``WriteGate``; ``lease.StreamLeases`` is the one implementation
(leases with fencing in Redis). Without one, the subscriber always writes (one replica, in-memory index).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from extproc.types import EndpointId


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

    async def applied(self, endpoint: EndpointId, seq: int, payload: bytes) -> None:
        """Batch ``seq`` is applied (or deliberately skipped): store it as the position, if the writer."""
        ...
