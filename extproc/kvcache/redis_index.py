"""Redis/Valkey ``PrefixIndex``, shared by every router replica. The only module that knows its key schema.

Key schema (``ns`` = the namespace, default ``"kvidx"``; ``<h>`` = a BlockHash as 8 raw bytes, big-endian)::

    {ns}:h:<endpoint>   HASH   field = <h>, value = expires-at in server ms ("0" = never)   what it holds
    {ns}:z:<endpoint>   ZSET   member = <h>, score = the endpoint's LRU clock (higher = stored more recently);
                               written only for entries stored with a ttl or under a capacity

The per-endpoint HASH is both the forward index and the "reverse set": a purge is one ``UNLINK`` of the
endpoint's two keys (O(1) for us; the server frees the memory, in the background for big keys), a precise
store is one ``HSET``, a removal one ``HDEL``.

* ``match`` is **one round trip**: EVALSHA of a Lua script that, for each requested endpoint, walks the
  request's hashes in order with ``HMGET`` over growing slices (16, 32, ... 2048 fields) and stops at that
  endpoint's first missing or expired block. Work is O(matched blocks × endpoints) field lookups, in C, and
  O(log matched) ``redis.call``s per endpoint; never one command per block from the client. (Walking
  per-block HASHes instead costs one ``redis.call`` per block even when a single endpoint is left: ~10× slower
  in ``bench/index_bench.py``.)
* ``store`` / ``remove`` are one script call each. Expiry uses the *server's* clock (``TIME``), so replicas'
  clocks do not matter.
* Capacity (optional, for the approximate mode): after a store, the endpoint's lowest-scored entries beyond
  its capacity are evicted. Scores come from a per-endpoint counter (top score + 1, ...); within one store the
  head block gets the highest score, so a prompt's tail is evicted before its prefix (as in memory).
* TTL: a per-(endpoint, block) expiry in the field value; ``match`` ignores expired fields at once. Expired
  entries are reclaimed lazily: each store drops up to ``_RECLAIM_PER_STORE`` expired entries from the old
  end of that endpoint's ZSET, capacity eviction drops the rest, and ``clear`` drops everything. (Per-field
  HEXPIRE would do this natively but needs Redis >= 7.4 / Valkey >= 9; this layout works on Redis 7 and
  Valkey 8/9: plain HASH/ZSET commands plus ``TIME`` in scripts.)
* Memory, valkey 9.1 (``bench/index_bench.py``): ~60 bytes per (endpoint, block) for precise entries (HASH
  only), ~150 with a ttl or capacity (HASH + ZSET). The 8-byte binary hash keeps fields short.

Redis Cluster: every key carries the hash tag ``{ns}``, so one namespace lives in **one slot**: a lookup's
keys (one per requested endpoint) never cross slots and the script runs on one shard. The trade-off: one
namespace is bounded by one shard's memory and CPU; scale out by namespace (e.g. one per model pool).

Hashes never become Lua numbers (doubles would lose bits above 2**53): they travel as 8-byte strings.
Every call has a deadline (``timeout_s``); any Redis or network failure raises ``IndexUnavailable``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from extproc.kvcache.index import IndexUnavailable
from extproc.types import BlockHash, EndpointId

_RECLAIM_PER_STORE = 64  # expired entries a store may drop from the old end of the endpoint's LRU
_CHUNK = 1000  # arguments per HSET/ZADD/HDEL inside scripts (Lua's unpack() has a stack limit)
_SMALL = 1024  # a HASH this small may be a listpack (valkey 9: up to 512 entries; Redis 7: 128)

_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live(v) return v and (v == '0' or tonumber(v) > now) end
"""

# The hashes travel as one blob of 8-byte big-endian values (ARGV[B]): thousands of separate arguments cost
# more to pack and parse than the lookups themselves. ``upto(j)`` splits it into F[1..j].
_BLOB = """
local blob = ARGV[B]
local n = #blob / 8
local F, split = {}, 0  -- F[i] = the i-th hash (1-based), split lazily as far as anyone needs
local function upto(j)
  for i = split + 1, j do F[i] = string.sub(blob, i * 8 - 7, i * 8) end
  if j > split then split = j end
end
"""

# KEYS: the requested endpoints' HASHes. ARGV[1]: the request's hashes (blob). Returns one count per KEY.
# Slices of HMGET (16, 32, ... 2048 fields) stop at the endpoint's first miss. A small HASH is a listpack,
# where HMGET scans all entries per field: past the first slice, one HGETALL and table lookups are cheaper.
_MATCH = _LIVE + _BLOB.replace("ARGV[B]", "ARGV[1]") + """
local out = {}
for k = 1, #KEYS do
  local held, step, all = 0, 16, nil
  while held < n do
    local hi = math.min(n, held + step)
    upto(hi)
    if all then
      upto(n)
      while held < n and live(all[F[held + 1]]) do held = held + 1 end
      break
    end
    local vals = redis.call('HMGET', KEYS[k], unpack(F, held + 1, hi))
    local j, m = 1, #vals
    while j <= m and (vals[j] == '0' or live(vals[j])) do j = j + 1 end
    held = held + j - 1
    if j <= m then break end
    if step == 16 and hi < n and redis.call('HLEN', KEYS[k]) <= SMALL then
      all = {}
      local kv = redis.call('HGETALL', KEYS[k])
      for x = 1, #kv, 2 do all[kv[x]] = kv[x + 1] end
    end
    step = math.min(step * 2, 2048)
  end
  out[k] = held
end
return out
"""

# KEYS: the endpoint's HASH, its ZSET. ARGV: ttl_ms (0 = none), capacity (-1 = none), the members (blob).
_STORE = _LIVE + _BLOB.replace("ARGV[B]", "ARGV[3]") + """
local h, z, ttl, cap = KEYS[1], KEYS[2], tonumber(ARGV[1]), tonumber(ARGV[2])
local exp = '0'
if ttl > 0 then exp = string.format('%.0f', now + ttl) end
upto(n)
for i = 1, n, CHUNK do
  local args = {}
  for k = i, math.min(i + CHUNK - 1, n) do args[#args + 1] = F[k]; args[#args + 1] = exp end
  redis.call('HSET', h, unpack(args))
end
if ttl == 0 and cap < 0 then return n end  -- precise entry: nothing to order
local top = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
local base = 0
if top[2] then base = tonumber(top[2]) end
for i = 1, n, CHUNK do
  local args = {}
  for k = i, math.min(i + CHUNK - 1, n) do
    args[#args + 1] = base + (n - k + 1)  -- head block highest: the tail is evicted first
    args[#args + 1] = F[k]
  end
  redis.call('ZADD', z, unpack(args))
end
if cap >= 0 then
  local over = redis.call('HLEN', h) - cap
  while over > 0 do
    local victims = redis.call('ZRANGE', z, 0, math.min(over, CHUNK) - 1)
    if #victims == 0 then break end
    redis.call('HDEL', h, unpack(victims))
    redis.call('ZREMRANGEBYRANK', z, 0, #victims - 1)
    over = over - #victims
  end
end
local olds = redis.call('ZRANGE', z, 0, RECLAIM - 1)
if #olds > 0 then
  local vals = redis.call('HMGET', h, unpack(olds))
  for i, m in ipairs(olds) do
    local v = vals[i]
    if v == '0' and cap >= 0 then break end
    if live(v) and v ~= '0' then break end
    if v and v ~= '0' then redis.call('HDEL', h, m) end
    redis.call('ZREM', z, m)  -- expired, stale, or permanent without a capacity: no longer ordered
  end
end
return n
"""

# KEYS: the endpoint's HASH, its ZSET. ARGV[1]: the members (blob).
_REMOVE = _BLOB.replace("ARGV[B]", "ARGV[1]") + """
upto(n)
for i = 1, n, CHUNK do
  local j = math.min(i + CHUNK - 1, n)
  redis.call('HDEL', KEYS[1], unpack(F, i, j))
  redis.call('ZREM', KEYS[2], unpack(F, i, j))
end
return 0
"""


def _script(body: str) -> str:
    for name, value in (("CHUNK", _CHUNK), ("RECLAIM", _RECLAIM_PER_STORE), ("SMALL", _SMALL)):
        body = body.replace(name, str(value))
    return body


class RedisPrefixIndex:
    """A ``PrefixIndex`` in Redis or Valkey (>= 7). Build it with ``connect``, or inject a client.

    ``client`` must be a ``redis.asyncio.Redis`` returning bytes (``decode_responses=False``) with its own
    socket timeouts; ``timeout_s`` is the overall deadline of each call. ``capacity_blocks`` as in
    ``MemoryPrefixIndex`` (``None``: no LRU bound; ttl entries are still reclaimed lazily).
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
        self._prefix = f"{{{namespace}}}:".encode()
        self._match = client.register_script(_script(_MATCH))
        self._store = client.register_script(_script(_STORE))
        self._remove = client.register_script(_script(_REMOVE))

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
        eps = list(dict.fromkeys(endpoints))
        keys = [self._key(b"h:", e) for e in eps]
        counts = await self._call(self._match(keys=keys, args=[_blob(hashes)]))
        return {e: int(n) for e, n in zip(eps, counts, strict=True) if int(n)}

    async def store(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None
    ) -> None:
        """Record ``hashes`` on ``endpoint`` with optional expiry; evicts beyond capacity. One script call."""
        if not hashes:
            return
        ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        cap = self._capacity_for(endpoint)
        args: list[bytes | int] = [ttl_ms, -1 if cap is None else cap, _blob(hashes)]
        await self._call(self._store(keys=self._keys(endpoint), args=args))

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None:
        """Forget ``hashes`` on ``endpoint``. One script call."""
        if hashes:
            await self._call(self._remove(keys=self._keys(endpoint), args=[_blob(hashes)]))

    async def clear(self, endpoint: EndpointId) -> None:
        """Forget everything on ``endpoint``: one UNLINK of its keys (the server frees them in the background)."""
        await self._call(self._r.unlink(*self._keys(endpoint)))

    async def close(self) -> None:
        """Close the client's connections."""
        await self._r.aclose()

    # -- extras ----------------------------------------------------------------------------------------------

    async def entries(self, endpoint: EndpointId) -> int:
        """How many blocks ``endpoint`` has in the index (expired but unreclaimed ones included)."""
        return int(await self._call(self._r.hlen(self._key(b"h:", endpoint))))

    # -- internals -------------------------------------------------------------------------------------------

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script, so the first calls are one round trip too (EVALSHA still falls back)."""
        for script in (self._match, self._store, self._remove):
            await self._r.script_load(script.script)

    def _key(self, kind: bytes, endpoint: EndpointId) -> bytes:
        return self._prefix + kind + endpoint.encode()

    def _keys(self, endpoint: EndpointId) -> list[bytes]:
        return [self._key(b"h:", endpoint), self._key(b"z:", endpoint)]

    def _capacity_for(self, endpoint: EndpointId) -> int | None:
        cap = self._capacity
        if cap is None or isinstance(cap, int):
            return cap
        return cap(endpoint)

    async def _call(self, awaitable: Any) -> Any:
        """Await one Redis call under the deadline, mapping every failure to IndexUnavailable."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await awaitable
        except TimeoutError:
            raise IndexUnavailable(f"redis: no answer within {self._timeout_s}s") from None
        except (RedisError, OSError) as exc:
            raise IndexUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc


def _blob(hashes: Sequence[BlockHash]) -> bytes:
    """The hashes as one string of 8-byte big-endian values (C-speed packing)."""
    return struct.pack(f">{len(hashes)}Q", *hashes)
