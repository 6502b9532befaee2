"""The ``PrefixIndex`` interface: which endpoint holds which prefix blocks.

Two writers share it. The *precise* path applies an engine's own KV events (BlockStored / BlockRemoved /
AllBlocksCleared) in order. The *approximate* path records our own decisions: after routing a request to E, its
blocks are assumed on E (bounded by E's KV capacity, LRU, with expiry). A read is one call per request.

Backends: in-memory (the embedded default for one replica) and Redis (shared by many replicas). One contract
suite (tests/contract/) runs against every backend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

from extproc.types import BlockHash, EndpointId


@dataclass(frozen=True, slots=True)
class Chain:
    """What a writer knows of the order of the hashes it stores: ``segments[i] = (start, parent)`` says that
    ``hashes[start:next start]`` are consecutive blocks of one prompt, the first following ``parent`` (``None``:
    the prompt's first block). Block hashes commit to their parent (vLLM's and ours), so this is true of an
    engine's ``BlockStored`` events and of a prompt hashed from its start. A backend may use it to answer a
    lookup without looking at every block (Redis); answers stay exact either way. Claim only what is true.
    """

    segments: tuple[tuple[int, BlockHash | None], ...]

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.segments]
        if not starts or starts[0] != 0 or any(b <= a for a, b in pairwise(starts)):
            raise ValueError(f"chain segments must start at 0 and increase: {starts}")

    @classmethod
    def from_root(cls) -> Chain:
        """The hashes are a prompt's blocks from its first."""
        return cls(((0, None),))

    @classmethod
    def after(cls, parent: BlockHash | None) -> Chain:
        """The hashes continue ``parent`` (None: from the prompt's first block)."""
        return cls(((0, parent),))


class GuessIndex(Protocol):
    """What the approximate index must do: every ``PrefixIndex`` operation but ``remove``. Our own routing writes
    it, always a prompt's blocks from its first (``Chain.from_root()``), and purges clear it; nothing removes
    single blocks (engines' evictions reach the precise index). Every ``PrefixIndex`` is one; ``ChainIndex`` is
    only this."""

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        """For each of ``endpoints``, how many *leading* blocks of ``hashes`` it holds (a run from block 0).
        ``hashes`` are a prompt's block hashes from its first block (every caller's are); a backend given
        ``Chain`` claims may rely on that.

        Called once per request on the read path. Endpoints holding none may be omitted. Never raises for
        unknown endpoints or hashes; backends with I/O may raise ``IndexUnavailable``.
        """
        ...

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
    ) -> None:
        """Record that ``endpoint`` now holds ``hashes`` (refreshing LRU position and expiry if present).

        ``ttl_s`` (when given) makes the entries expire: used for approximate entries and burst-sibling marks.
        ``chain`` (when given) says how the hashes follow each other (``Chain``); without it nothing is assumed.
        """
        ...

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint`` (reset, restart, gap without replay). Costs O(its entries)."""
        ...

    async def close(self) -> None:
        """Release connections; the index is unusable afterwards."""
        ...


class PrefixIndex(GuessIndex, Protocol):
    """An index engines' events can keep (the precise one): a ``GuessIndex`` that also forgets single blocks."""

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Forget ``hashes`` on ``endpoint`` (an engine evicted them)."""
        ...


class IndexUnavailable(Exception):
    """The backend could not answer (down, slow past its deadline): route by load and the approximate index."""
