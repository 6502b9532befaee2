"""The prefix indexes, leases and shared load a config asks for: the composition root's one branch on the backend.

``memory``: both indexes in this replica's memory. ``redis``: the precise index in Redis, shared by every
replica (with leases, only one replica at a time writes each endpoint's events: ``extproc/redis/leases.py``);
our own guesses in memory *and* mirrored to Redis, so a replica sees what another one routed a moment ago; and
the in-flight load shared in Redis too, and where each replica routed (``redis.touches``).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from extproc.config import IndexConfig, RedisIndexConfig
from extproc.kvcache.chain_index import ChainIndex
from extproc.kvcache.gate import IndexWrites
from extproc.kvcache.index import GuessIndex, PrefixIndex
from extproc.kvcache.memory_index import MemoryPrefixIndex
from extproc.kvcache.mirrored_index import MirroredIndex
from extproc.redis.client import client_for
from extproc.redis.leases import StreamLeases
from extproc.redis.prefix_index import RedisPrefixIndex
from extproc.redis.shared_load import SharedLoad
from extproc.redis.touches import SharedTouches
from extproc.types import EndpointId

Capacity = Callable[[EndpointId], int]


@dataclass
class Indexes:
    """What the router and the event feed read and write. ``writes``: the precise index as ingest writes it."""

    precise: PrefixIndex
    approx: GuessIndex
    writes: IndexWrites
    leases: StreamLeases | None = None
    shared_load: SharedLoad | None = None
    touches: SharedTouches | None = None  # where the other replicas routed and what they predicted there
    share_hot_sets: bool = False  # ``touches`` carries the hot sets' touches
    share_predictions: bool = False  # ``touches`` carries the calibration's predictions
    share_due_calls: bool = False  # ``touches`` carries the chains' due calls
    counters: list[tuple[str, object]] = field(default_factory=list)  # extra groups for router_kv_<group>_*
    # {"precise" | "approx": the in-memory index whose size can be read without I/O}; a Redis-only index is absent
    sizes: dict[str, MemoryPrefixIndex | ChainIndex] = field(default_factory=dict)

    async def close(self) -> None:
        """Close every connection (after the feed stopped writing)."""
        await self.precise.close()
        if self.shared_load is not None:
            await self.shared_load.close()
        if self.touches is not None:
            await self.touches.close()
        await self.approx.close()


def build_indexes(config: IndexConfig, approx_capacity: Capacity, prefill_tokens_per_s: float) -> Indexes:
    """The indexes ``config`` names; nothing connects yet (Redis may be down at start)."""
    if not isinstance(config, RedisIndexConfig):
        precise, guesses = MemoryPrefixIndex(), ChainIndex(capacity_blocks=approx_capacity)
        return Indexes(precise, guesses, writes=precise, sizes={"precise": precise, "approx": guesses})
    client = client_for(config.url, config.timeout_s)
    shared = RedisPrefixIndex(client, namespace=config.namespace, timeout_s=config.timeout_s)
    local = ChainIndex(capacity_blocks=approx_capacity)
    approx = MirroredIndex(
        local,
        RedisPrefixIndex.from_url(config.url, namespace=f"{config.namespace}-approx", timeout_s=config.timeout_s,
                                  capacity_blocks=approx_capacity),
        shared_timeout_s=config.lookup_deadline_s,  # the router allows twice this for the approximate index
    )  # fmt: skip
    load = SharedLoad.from_url(
        config.url, namespace=config.namespace, prefill_tokens_per_s=prefill_tokens_per_s, timeout_s=config.timeout_s
    )
    indexes = Indexes(shared, approx, writes=shared, shared_load=load, counters=[("redis_lookups", shared.lookups)],
                      sizes={"approx": local})  # fmt: skip
    if config.share_hot_sets or config.share_predictions or config.share_due_calls:
        indexes.touches = SharedTouches.from_url(config.url, namespace=config.namespace, timeout_s=config.timeout_s)
        indexes.counters.append(("touches", indexes.touches.counters))
        indexes.share_hot_sets, indexes.share_predictions = config.share_hot_sets, config.share_predictions
        indexes.share_due_calls = config.share_due_calls
    if config.leases.enabled:
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        leases = StreamLeases(client, owner, namespace=config.namespace, ttl_s=config.leases.ttl_s,
                              timeout_s=config.timeout_s)  # fmt: skip
        indexes.leases, indexes.writes = leases, leases.writes(shared)
        indexes.counters.insert(0, ("lease", leases.counters))
    return indexes
