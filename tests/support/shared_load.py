"""An in-memory ``SharedQueue`` (``extproc.redis.shared_load``): the shared load's semantics without Redis, for
unit tests of the decider's reservation step and as the contract suite's reference backend.

Like Redis, each call takes effect when it "arrives" (at once), then answers after one turn of the event loop
(``delay_s`` more if set), so concurrent decisions interleave the way replicas' round trips do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from extproc.redis.shared_load import ANY_VERSION, Reservation, SharedLoadUnavailable, SharedQueues
from extproc.types import EndpointId


class MemorySharedLoad:
    """``{endpoint: (tokens, updated_at_s, version)}``, draining at ``prefill_tokens_per_s`` on ``clock``, and
    ``{endpoint: busy until (clock)}``."""

    def __init__(self, prefill_tokens_per_s: float, clock: Callable[[], float], *, delay_s: float = 0.0) -> None:
        self._rate = prefill_tokens_per_s
        self._clock = clock
        self._queues: dict[EndpointId, tuple[float, float, int]] = {}
        self._busy_until: dict[EndpointId, float] = {}
        self.delay_s = delay_s
        self.down = False
        self.calls: list[str] = []  # "read" | "add" | "reserve", in arrival order

    async def read(self, endpoints: Sequence[EndpointId]) -> SharedQueues:
        self._arrive("read")
        view = self._view(endpoints)
        await self._answer()
        return view

    async def add(self, endpoint: EndpointId, tokens: int, busy_s: float = 0.0) -> None:
        self._arrive("add")
        if tokens > 0:
            self._put(endpoint, tokens, busy_s)
        await self._answer()

    async def reserve(
        self, pick: EndpointId, tokens: int, version: int, endpoints: Sequence[EndpointId], busy_s: float = 0.0
    ) -> Reservation:
        self._arrive("reserve")
        current = self._now(pick)[1]
        reserved = tokens > 0 and version in (ANY_VERSION, current)
        if reserved:
            self._put(pick, tokens, busy_s)
        view = self._view(endpoints if pick in endpoints else [pick, *endpoints])
        await self._answer()
        return Reservation(reserved, view)

    async def forget(self, endpoint: EndpointId) -> None:
        self._arrive("forget")
        self._queues.pop(endpoint, None)
        self._busy_until.pop(endpoint, None)
        await self._answer()

    async def close(self) -> None:
        pass

    def _arrive(self, call: str) -> None:
        if self.down:
            raise SharedLoadUnavailable("fake: down")
        self.calls.append(call)

    async def _answer(self) -> None:
        await asyncio.sleep(self.delay_s)

    def _now(self, endpoint: EndpointId) -> tuple[float, int]:
        tokens, at, version = self._queues.get(endpoint, (0.0, self._clock(), 0))
        return max(0.0, tokens - self._rate * max(0.0, self._clock() - at)), version

    def _put(self, endpoint: EndpointId, tokens: int, busy_s: float) -> None:
        queued, version = self._now(endpoint)
        self._queues[endpoint] = (queued + tokens, self._clock(), version + 1)
        if busy_s > 0:
            self._busy_until[endpoint] = max(self._busy_until.get(endpoint, 0.0), self._clock() + busy_s)

    def _view(self, endpoints: Sequence[EndpointId]) -> SharedQueues:
        now = {e: self._now(e) for e in endpoints}
        busy = {e: max(self._busy_until.get(e, 0.0) - self._clock(), 0.0) for e in endpoints}
        return SharedQueues({e: q for e, (q, _) in now.items()}, {e: v for e, (_, v) in now.items()}, busy)
