"""The contract suite's view of one backend (built by ``tests/contract/conftest.py``'s ``harness`` fixture)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from extproc.kvcache.index import PrefixIndex


@dataclass
class Harness:
    """A backend under test: ``make(capacity_blocks=...)`` gives a fresh index; ``advance(s)`` moves time."""

    name: str
    make: Callable[..., Awaitable[PrefixIndex]]
    advance: Callable[[float], Awaitable[None]]
    ttl_unit_s: float  # a TTL short enough to wait out in a test, long enough not to expire by accident
    _made: list[PrefixIndex] = field(default_factory=list)

    async def close_all(self) -> None:
        for index in self._made:
            await index.close()
