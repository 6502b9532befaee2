"""Redis/Valkey ``PrefixIndex``, shared by every router replica. The only module that knows its key schema.

Key schema (``ns`` = the namespace, default ``"kvidx"``; ``<h>`` = a BlockHash as 8 raw bytes, big-endian)::

    {ns}:b:<h>          HASH   field = endpoint id, value = expires-at in server ms ("0" = never)
    {ns}:e:<endpoint>   ZSET   member = <h>, score = the endpoint's LRU clock (higher = stored more recently)

* ``match`` is **one round trip**: EVALSHA of a Lua script that walks the block keys in request order, keeps
  the requested endpoints whose field is present and unexpired, and stops as soon as none remain. Cost
  O(matched blocks × requested endpoints) server-side; never one command per block from the client.
* ``store`` / ``remove`` are one script call each: HSET/HDEL on the block hashes plus ZADD/ZREM on the
  endpoint's reverse ZSET. Expiry uses the *server's* clock (``TIME``), so replicas' clocks do not matter.
* ``clear`` walks the endpoint's reverse ZSET: O(its entries), in slices of ``_CLEAR_SLICE`` per script call
  so that one huge endpoint does not block the server for long.
* Capacity (optional, for the approximate mode): after a store, the endpoint's lowest-scored entries beyond
  its capacity are evicted. Scores come from a per-endpoint counter (top score + 1, ...), and within one store
  the head block gets the highest score, so a prompt's tail is evicted before its prefix (as in memory).
* TTL: a per-(block, endpoint) expiry in the field value; ``match`` ignores expired fields at once. Expired
  entries are reclaimed lazily: each store drops up to ``_RECLAIM_PER_STORE`` expired entries from the old
  end of that endpoint's ZSET, capacity eviction drops the rest, and ``clear`` drops everything. (Per-field
  HEXPIRE would do this natively but needs Redis >= 7.4 / Valkey >= 9; this layout works on Redis 7 and
  Valkey 8/9.)
* Memory: about 150-200 bytes per (block, endpoint) entry; ``bench/index_bench.py`` measures ``INFO memory``
  per million blocks. The 8-byte binary hash (not its 20-digit decimal) keeps keys and members short.

Redis Cluster: every key carries the hash tag ``{ns}``, so one namespace lives in **one slot**. A lookup then
touches a single shard and the script's keys never cross slots, and ``clear``/eviction may reach block keys
derived from the reverse ZSET (same slot) that were not declared up front. The trade-off: one namespace is
bounded by one shard's memory and CPU; scale out by namespace (e.g. one per model pool), not by key.

Hashes never become Lua numbers (doubles would lose bits above 2**53): they travel as 8-byte strings.
Every call has a deadline (``timeout_s``); any Redis or network failure raises ``IndexUnavailable``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from extproc.kvcache.index import IndexUnavailable
from extproc.types import BlockHash, EndpointId

_CLEAR_SLICE = 10_000  # reverse-index entries deleted per clear script call
_CLEAR_MAX_CALLS = 100_000  # bound on clear's loop (1e9 entries); a concurrent writer cannot keep it alive
_RECLAIM_PER_STORE = 64  # expired entries a store may drop from the old end of the endpoint's LRU
_CHUNK = 1000  # arguments per ZADD/ZREM inside scripts (Lua's unpack() has a stack limit)

_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: block keys in request order. ARGV: endpoints. Returns {endpoint, count, ...} for counts > 0.
_MATCH = _NOW_MS + """
local alive, list, seen = {}, {}, {}
for _, e in ipairs(ARGV) do
  if not seen[e] then seen[e] = true; alive[e] = true; list[#list + 1] = e end
end
local out, depth = {}, 0
for i = 1, #KEYS do
  if #list == 0 then break end
  local vals = redis.call('HMGET', KEYS[i], unpack(list))
  local keep = {}
  for j, e in ipairs(list) do
    local v = vals[j]
    if v and (v == '0' or tonumber(v) > now) then
      keep[#keep + 1] = e
    elseif depth > 0 then
      out[#out + 1] = e; out[#out + 1] = depth
    end
  end
  list = keep
  depth = depth + 1
end
if depth > 0 then
  for _, e in ipairs(list) do out[#out + 1] = e; out[#out + 1] = depth end
end
return out
"""

# KEYS[1]: the endpoint's ZSET; KEYS[2..n+1]: block keys. ARGV: endpoint, ttl_ms (0 = none), capacity
# (-1 = none), block-key prefix, then the n members (8-byte hashes) in the same order as the block keys.
_STORE = _NOW_MS + """
local z, ep, ttl, cap, prefix = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local exp = '0'
if ttl > 0 then exp = string.format('%.0f', now + ttl) end
local n = #KEYS - 1
local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
local base = 0
if top[2] then base = tonumber(top[2]) end
for i = 1, n do redis.call('HSET', KEYS[i + 1], ep, exp) end
local i = 1
while i <= n do
  local args = {}
  for k = i, math.min(i + CHUNK - 1, n) do
    args[#args + 1] = base + (n - k + 1)  -- head block highest: the tail is evicted first
    args[#args + 1] = ARGV[k + 4]
  end
  redis.call('ZADD', z, unpack(args))
  i = i + CHUNK
end
if cap >= 0 then
  local over = redis.call('ZCARD', z) - cap
  while over > 0 do
    local victims = redis.call('ZRANGE', z, 0, math.min(over, CHUNK) - 1)
    for _, m in ipairs(victims) do redis.call('HDEL', prefix .. m, ep) end
    redis.call('ZREMRANGEBYRANK', z, 0, #victims - 1)
    over = over - #victims
  end
end
local olds = redis.call('ZRANGE', z, 0, RECLAIM - 1)
for _, m in ipairs(olds) do
  local v = redis.call('HGET', prefix .. m, ep)
  if v and (v == '0' or tonumber(v) > now) then break end
  if v then redis.call('HDEL', prefix .. m, ep) end
  redis.call('ZREM', z, m)
end
return n
"""

# KEYS[1]: the endpoint's ZSET; KEYS[2..]: block keys. ARGV: endpoint, then the members in the same order.
_REMOVE = """
local z, ep = KEYS[1], ARGV[1]
for i = 2, #KEYS do redis.call('HDEL', KEYS[i], ep) end
local i = 2
while i <= #ARGV do
  redis.call('ZREM', z, unpack(ARGV, i, math.min(i + CHUNK - 1, #ARGV)))
  i = i + CHUNK
end
return 0
"""

# KEYS[1]: the endpoint's ZSET. ARGV: endpoint, block-key prefix, slice. Returns entries left.
_CLEAR = """
local z, ep, prefix, slice = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local ms = redis.call('ZRANGE', z, 0, slice - 1)
for _, m in ipairs(ms) do redis.call('HDEL', prefix .. m, ep) end
if #ms > 0 then redis.call('ZREMRANGEBYRANK', z, 0, #ms - 1) end
return redis.call('ZCARD', z)
"""


def _script(body: str) -> str:
    return body.replace("CHUNK", str(_CHUNK)).replace("RECLAIM", str(_RECLAIM_PER_STORE))


class RedisPrefixIndex:
    """A ``PrefixIndex`` in Redis or Valkey (>= 7). Build it with ``connect``, or inject a client.

    ``client`` must be a ``redis.asyncio.Redis`` returning bytes (``decode_responses=False``) with its own
    socket timeouts; ``timeout_s`` is the overall deadline of each call. ``capacity_blocks`` as in
    ``MemoryPrefixIndex`` (``None``: TTL-only, no LRU bound).
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        namespace: str = "kvidx",
        timeout_s: float = 0.5,
        capacity_blocks: int | Callable[[EndpointId], int | None] | None = None,
    ) -> None:
        if not namespace or any(c in namespace for c in "{}"):
            raise ValueError(f"namespace must be non-empty without braces: {namespace!r}")
        self._r = client
        self._timeout_s = timeout_s
        self._capacity = capacity_blocks
        self._block_prefix = f"{{{namespace}}}:b:".encode()
        self._endpoint_prefix = f"{{{namespace}}}:e:".encode()
        self._match = client.register_script(_script(_MATCH))
        self._store = client.register_script(_script(_STORE))
        self._remove = client.register_script(_script(_REMOVE))
        self._clear = client.register_script(_script(_CLEAR))

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        namespace: str = "kvidx",
        timeout_s: float = 0.5,
        capacity_blocks: int | Callable[[EndpointId], int | None] | None = None,
    ) -> RedisPrefixIndex:
        """Connect to ``url`` (``redis://host:port/db``) and load the scripts. Raises IndexUnavailable."""
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), retries=1),  # one quick retry for a stale pooled connection
            decode_responses=False,
        )
        index = cls(client, namespace=namespace, timeout_s=timeout_s, capacity_blocks=capacity_blocks)
        try:
            await index._call(index._load_scripts())
        except IndexUnavailable:
            await client.aclose()
            raise
        return index

    # -- PrefixIndex -------------------------------------------------------------------------------------

    async def match(
        self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]
    ) -> Mapping[EndpointId, int]:
        """Leading-run length per endpoint (zeros omitted), in one EVALSHA. Raises IndexUnavailable."""
        if not hashes or not endpoints:
            return {}
        keys = [self._block_prefix + _h(h) for h in hashes]
        flat = await self._call(self._match(keys=keys, args=list(endpoints)))
        return {EndpointId(flat[i].decode()): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def store(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None
    ) -> None:
        """Record ``hashes`` on ``endpoint`` with optional expiry; evicts beyond capacity. One script call."""
        if not hashes:
            return
        members = [_h(h) for h in hashes]
        ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        cap = self._capacity_for(endpoint)
        keys = [self._zset(endpoint), *(self._block_prefix + m for m in members)]
        args: list[bytes | str | int] = [endpoint, ttl_ms, -1 if cap is None else cap, self._block_prefix]
        args.extend(members)
        await self._call(self._store(keys=keys, args=args))

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Forget ``hashes`` on ``endpoint``. One script call."""
        if not hashes:
            return
        members = [_h(h) for h in hashes]
        keys = [self._zset(endpoint), *(self._block_prefix + m for m in members)]
        args: list[bytes | str] = [endpoint, *members]
        await self._call(self._remove(keys=keys, args=args))

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint``: O(its entries), ``_CLEAR_SLICE`` per script call."""
        args: list[bytes | str | int] = [endpoint, self._block_prefix, _CLEAR_SLICE]
        for _ in range(_CLEAR_MAX_CALLS):
            left = await self._call(self._clear(keys=[self._zset(endpoint)], args=args))
            if int(left) == 0:
                return

    async def close(self) -> None:
        """Close the client's connections."""
        await self._r.aclose()

    # -- extras ----------------------------------------------------------------------------------------------

    async def entries(self, endpoint: EndpointId) -> int:
        """How many blocks ``endpoint`` has in the index (expired but unreclaimed ones included)."""
        return int(await self._call(self._r.zcard(self._zset(endpoint))))

    # -- internals -------------------------------------------------------------------------------------------

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script, so the first calls are one round trip too (EVALSHA still falls back)."""
        for script in (self._match, self._store, self._remove, self._clear):
            await self._r.script_load(script.script)

    def _zset(self, endpoint: EndpointId) -> bytes:
        return self._endpoint_prefix + endpoint.encode()

    def _capacity_for(self, endpoint: EndpointId) -> int | None:
        cap = self._capacity
        if cap is None or isinstance(cap, int):
            return cap
        return cap(endpoint)

    async def _call(self, awaitable: Any) -> Any:
        """Await one Redis call under the deadline, mapping every failure to IndexUnavailable."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._timeout_s):
                return await awaitable
        except TimeoutError:
            raise IndexUnavailable(f"redis: no answer within {self._timeout_s}s") from None
        except (RedisError, OSError) as exc:
            took = time.monotonic() - started
            raise IndexUnavailable(f"redis: {type(exc).__name__}: {exc} (after {took:.3f}s)") from exc


def _h(h: BlockHash) -> bytes:
    return int(h).to_bytes(8, "big")
