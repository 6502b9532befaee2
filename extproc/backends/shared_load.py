"""In-flight load shared by every picker replica: one virtual prefill queue per endpoint, kept in Redis.

Each replica adds the uncached prompt tokens of what it routes; the queue drains at the endpoint's prefill
rate, computed server-side from Redis ``TIME`` so replicas need no synchronised clocks. Reading every
candidate's queue and adding to the pick's are one script call each (one round trip).

A reservation therefore expires by itself (it drains away), which bounds the damage of a replica that dies
mid-burst. If Redis is slow or down, callers fall back to their own replica-local ``InflightLoad``.

Keys (the hash tag keeps them on one Redis Cluster slot, like the prefix index's)::

    {ns}:load   HASH  field = endpoint id, value = "<tokens>:<updated_ms>"
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from extproc.kvcache.redis_index import RedisClient, redis_client
from extproc.types import EndpointId

# KEYS[1] = {ns}:load; ARGV[1] = rate (tokens/s); ARGV[2] = add (tokens, may be 0); ARGV[3..] = endpoints.
# With add > 0 there is exactly one endpoint. Returns the drained queues (strings, for exact floats).
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1]) / 1000.0
local add = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  local q = 0.0
  if v then
    local sep = string.find(v, ':', 1, true)
    local tokens = tonumber(string.sub(v, 1, sep - 1))
    local at = tonumber(string.sub(v, sep + 1))
    q = math.max(0.0, tokens - rate * math.max(0, now - at))
  end
  if add > 0 then
    q = q + add
    redis.call('HSET', KEYS[1], ARGV[i], string.format('%.1f', q) .. ':' .. now)
  end
  out[#out + 1] = string.format('%.1f', q)
end
return out
"""


class SharedLoadUnavailable(Exception):
    """Redis did not answer in time: use this replica's own view."""


class SharedLoad:
    """The shared virtual queues. ``prefill_tokens_per_s`` must be the same on every replica."""

    def __init__(self, client: RedisClient, *, namespace: str, prefill_tokens_per_s: float, timeout_s: float) -> None:
        self._r = client
        self._key = f"{{{namespace}}}:load"
        self._rate = prefill_tokens_per_s
        self._timeout_s = timeout_s
        self._script = client.register_script(_SCRIPT)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, prefill_tokens_per_s: float, timeout_s: float) -> SharedLoad:
        client = redis_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
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
        await self._call(self._r.hdel(self._key, endpoint))

    async def close(self) -> None:
        await self._r.aclose()

    async def _call(self, awaitable: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await awaitable
        except TimeoutError:
            raise SharedLoadUnavailable(f"redis: no answer within {self._timeout_s}s") from None
        except (RedisError, RedisClusterException, OSError) as exc:  # the cluster's own are not RedisErrors
            raise SharedLoadUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
