"""Every Redis key the router uses, in one place: the prefix index, the event-stream leases, the shared load and
the replicas' touches.

Key schema (``ns`` = the namespace, default ``"kvidx"``; ``<h>`` = a BlockHash as 8 raw bytes, big-endian)::

    {ns}:m              HASH    field = <h>, value = holder bitmap: bit s set <=> the endpoint in slot s has it
    {ns}:slots          HASH    field = endpoint id, value = its slot (a small int, reused once it is freed)
    {ns}:free           ZSET    freed slots (score = slot, so the lowest is reused first)
    {ns}:next           STRING  the next never-used slot
    {ns}:h:<endpoint>   HASH    field = <h>, value = expires-at in server ms ("0" = never): what it holds;
                                for an entry rooted in a claimed chain: "<expires-at>|<rooted children>|<parent
                                <h>, empty for a prompt's first block>" (``scripts.py``)
    {ns}:u              HASH    field = endpoint id, value = how many of its entries are not rooted
    {ns}:holey          HASH    field = endpoint id, value = how many of its rooted entries lost their parent
    {ns}:x:<endpoint>   ZSET    member = <h>, score = expires-at ms: its entries that have a ttl
    {ns}:z:<endpoint>   ZSET    member = <h>, score = its LRU clock (higher = stored more recently): only when
                                the index has a capacity
    {ns}:lease:<endpoint>  HASH  owner = replica id, token = its fencing token; PX = the lease ttl. Who applies
                                the endpoint's KV-event stream (``leases.py``); gone = nobody. The index's
                                fenced writes read ``token`` (``common.lua``'s ``fenced``)
    {ns}:stream:<endpoint> HASH  fence = the last token handed out (HINCRBY per acquisition; starts at the
                                server's time in ms, so it grows even if Redis loses it);
                                seq, digest = the last batch applied to the index (its sequence number and the
                                first 8 bytes of blake2b of its payload): where a new owner resumes
    {ns}:load           HASH    field = endpoint id, value = "<tokens>:<updated_ms>:<version>" (``shared_load.py``;
                                version = reservations so far, "<tokens>:<updated_ms>" reads as version 0);
                                field = "<endpoint id>#busy", value = the latest predicted first token of a
                                reservation there, in server ms
    {ns}:touches        STREAM  field t = a batch of one replica's touches: where it routed and what each request
                                hit, placed and stored there (``touches.py``); trimmed to about 1,024 entries

Every key carries the hash tag ``{ns}``, so one namespace lives in one Redis Cluster slot and every script's
keys (all declared in KEYS, never built inside Lua) are on one node.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from extproc.types import BlockHash, EndpointId

_OWN_KEYS_CACHED = 65_536  # a bound on the per-endpoint key cache, in case endpoint names churn without end


def pack_hashes(hashes: Sequence[BlockHash]) -> bytes:
    """``hashes`` as one string of ``<h>``: 8-byte big-endian values (C-speed packing)."""
    return struct.pack(f">{len(hashes)}Q", *hashes)


def unpack_hashes(blob: bytes, offset: int, count: int) -> tuple[list[BlockHash], int]:
    """``count`` hashes packed by ``pack_hashes`` at ``offset`` of ``blob``, and the offset just past them.
    Raises ``struct.error`` when short."""
    packed = struct.Struct(f">{count}Q")
    return list(packed.unpack_from(blob, offset)), offset + packed.size


@dataclass(frozen=True, slots=True)
class EndpointKeys:
    """One endpoint's keys: its entries (``h``), LRU (``z``) and expiry (``x``) sets, lease and stream."""

    held: bytes
    lru: bytes
    expiry: bytes
    lease: bytes
    stream: bytes


@dataclass(frozen=True)
class Schema:
    """The key names of one namespace (see the module docstring)."""

    namespace: str = "kvidx"
    _own: dict[EndpointId, EndpointKeys] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.namespace or any(c in self.namespace for c in "{}"):
            raise ValueError(f"namespace must be non-empty without braces: {self.namespace!r}")

    @property
    def prefix(self) -> bytes:
        return f"{{{self.namespace}}}:".encode()

    def index_keys(self) -> list[bytes]:
        """The prefix index's shared keys, in its scripts' KEYS order: m, slots, free, u, holey, next."""
        return [self.prefix + k for k in (b"m", b"slots", b"free", b"u", b"holey", b"next")]

    @property
    def load(self) -> bytes:
        """The shared load's HASH."""
        return self.prefix + b"load"

    @staticmethod
    def busy_field(endpoint: EndpointId) -> str:
        """The shared load's field for how long ``endpoint`` is busy (``lua/shared_load.lua`` builds the same
        name: the endpoint id and ``#busy``)."""
        return f"{endpoint}#busy"

    @property
    def touches(self) -> bytes:
        """The replicas' touches STREAM."""
        return self.prefix + b"touches"

    def endpoint(self, endpoint: EndpointId) -> EndpointKeys:
        """``endpoint``'s own keys (built once per endpoint)."""
        keys = self._own.get(endpoint)
        if keys is None:
            p, e = self.prefix, endpoint.encode()
            keys = EndpointKeys(p + b"h:" + e, p + b"z:" + e, p + b"x:" + e, p + b"lease:" + e, p + b"stream:" + e)
            if len(self._own) < _OWN_KEYS_CACHED:
                self._own[endpoint] = keys
        return keys
