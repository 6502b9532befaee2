"""The approximate index when replicas share Redis: our guesses and burst marks in memory *and* in Redis.

Each replica's own guesses answer at memory speed and survive a Redis outage; the shared copy lets a request
that another replica routed a moment ago (before the engine's ``BlockStored`` arrives) follow its sibling
instead of copying the prefix to a second backend. ``match`` takes, per endpoint, the longer of the two runs.
Shared failures never fail a call: the local answer stands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from extproc.kvcache.index import Chain, GuessIndex, IndexUnavailable
from extproc.tasks import stop_task, within_or_orphan
from extproc.types import BlockHash, EndpointId

log = logging.getLogger(__name__)


class MirroredIndex:
    """A ``GuessIndex`` over ``local`` (authoritative for availability) and ``shared`` (best effort)."""

    def __init__(self, local: GuessIndex, shared: GuessIndex, *, shared_timeout_s: float) -> None:
        self._local = local
        self._shared = shared
        self._timeout_s = shared_timeout_s  # below the router's lookup deadline, so local guesses always count
        self._late: set[asyncio.Task[Any]] = set()  # shared matches past the timeout, left to finish

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        local, shared = await asyncio.gather(self._local.match(hashes, endpoints), self._quiet_match(hashes, endpoints))
        return {e: max(local.get(e, 0), shared.get(e, 0)) for e in {*local, *shared}}

    async def _quiet_match(
        self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]
    ) -> Mapping[EndpointId, int]:
        try:
            # left to finish, not cancelled: a cancelled Redis read costs its pooled connection (tasks.py)
            return await within_or_orphan(self._shared.match(hashes, endpoints), self._timeout_s, self._late)
        except (IndexUnavailable, TimeoutError) as exc:
            log.debug("shared approximate index unavailable: %s", exc)
            return {}

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
    ) -> None:
        await self._local.store(endpoint, hashes, ttl_s=ttl_s, chain=chain)
        await self._quietly(self._shared.store(endpoint, hashes, ttl_s=ttl_s, chain=chain))

    async def clear(self, endpoint: EndpointId) -> None:
        await self._local.clear(endpoint)
        await self._quietly(self._shared.clear(endpoint))

    async def close(self) -> None:
        for task in list(self._late):
            await stop_task(task)
        await self._local.close()
        await self._shared.close()

    @staticmethod
    async def _quietly(call: object) -> None:
        try:
            await call  # type: ignore[misc]
        except IndexUnavailable as exc:
            log.debug("shared approximate index unavailable: %s", exc)
