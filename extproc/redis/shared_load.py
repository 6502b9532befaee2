"""In-flight load shared by every picker replica: one virtual prefill queue per endpoint, kept in Redis.

Each replica adds the uncached prompt tokens of what it routes; the queue drains at the endpoint's prefill
rate, computed server-side from Redis ``TIME`` so replicas need no synchronised clocks. Reading every
candidate's queue and adding to the pick's are one script call each (one round trip; ``lua/shared_load.lua``).

A reservation therefore expires by itself (it drains away), which bounds the damage of a replica that dies
mid-burst. If Redis is slow or down, callers fall back to their own replica-local ``InflightLoad``.

Key: ``{ns}:load`` (``schema.py``; the hash tag keeps it on one Redis Cluster slot, like the prefix index's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extproc.redis.client import RedisClient, call_within, client_for
from extproc.redis.schema import Schema
from extproc.redis.scripts import source
from extproc.types import EndpointId


class SharedLoadUnavailable(Exception):
    """Redis did not answer in time: use this replica's own view."""


class SharedLoad:
    """The shared virtual queues. ``prefill_tokens_per_s`` must be the same on every replica."""

    def __init__(self, client: RedisClient, *, namespace: str, prefill_tokens_per_s: float, timeout_s: float) -> None:
        self._r = client
        self._key = Schema(namespace).load
        self._rate = prefill_tokens_per_s
        self._timeout_s = timeout_s
        self._script = client.register_script(source("shared_load"))

    @classmethod
    def from_url(cls, url: str, *, namespace: str, prefill_tokens_per_s: float, timeout_s: float) -> SharedLoad:
        """Shared load on ``url``, connecting lazily (its calls raise SharedLoadUnavailable until Redis answers)."""
        client = client_for(url, timeout_s)
        return cls(client, namespace=namespace, prefill_tokens_per_s=prefill_tokens_per_s, timeout_s=timeout_s)

    async def queued(self, endpoints: Sequence[EndpointId]) -> Mapping[EndpointId, float]:
        """Every endpoint's queued prefill tokens now. Raises SharedLoadUnavailable."""
        if not endpoints:
            return {}
        values = await self._call(self._script(keys=[self._key], args=[self._rate, 0, *endpoints]))
        return {e: float(v) for e, v in zip(endpoints, values, strict=True)}

    async def add(self, endpoint: EndpointId, tokens: int) -> None:
        """Reserve ``tokens`` of prefill on ``endpoint`` (they drain at the prefill rate). Raises
        SharedLoadUnavailable."""
        if tokens > 0:
            await self._call(self._script(keys=[self._key], args=[self._rate, tokens, endpoint]))

    async def forget(self, endpoint: EndpointId) -> None:
        """Drop ``endpoint``'s queue (it left the pool). Raises SharedLoadUnavailable."""
        await self._call(self._r.hdel(self._key, endpoint))

    async def close(self) -> None:
        await self._r.aclose()

    async def _call(self, awaitable: Any) -> Any:
        return await call_within(awaitable, self._timeout_s, SharedLoadUnavailable)
