"""The ``PrefixIndex`` interface: which endpoint holds which prefix blocks.

Two writers share it. The *precise* path applies an engine's own KV events (BlockStored / BlockRemoved /
AllBlocksCleared) in order. The *approximate* path records our own decisions: after routing a request to E, its
blocks are assumed on E (bounded by E's KV capacity, LRU, with expiry). A read is one call per request.

Backends: in-memory (the embedded default for one replica) and Redis (shared by many replicas). One contract
suite (tests/contract/) runs against every backend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from extproc.types import BlockHash, EndpointId


class PrefixIndex(Protocol):
    async def match(
        self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]
    ) -> Mapping[EndpointId, int]:
        """For each of ``endpoints``, how many *leading* blocks of ``hashes`` it holds (a run from block 0).

        Called once per request on the read path. Endpoints holding none may be omitted. Never raises for
        unknown endpoints or hashes; backends with I/O may raise ``IndexUnavailable``.
        """
        ...

    async def store(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None
    ) -> None:
        """Record that ``endpoint`` now holds ``hashes`` (refreshing LRU position and expiry if present).

        ``ttl_s`` (when given) makes the entries expire: used for approximate entries and burst-sibling marks.
        """
        ...

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Forget ``hashes`` on ``endpoint`` (an engine evicted them)."""
        ...

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint`` (reset, restart, gap without replay). Costs O(its entries)."""
        ...

    async def close(self) -> None:
        """Release connections; the index is unusable afterwards."""
        ...


class IndexUnavailable(Exception):
    """The backend could not answer (down, slow past its deadline): route by load and the approximate index."""
