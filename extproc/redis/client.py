"""The Redis client: one factory for every URL we accept, and the one mapping of a slow or failed call.

``redis[s]://...`` gives a plain ``Redis``; ``redis[s]+cluster://host:port`` (any one node, a seed) gives a
``RedisCluster`` that discovers the others (db 0 only). Clients connect lazily, so a router starts while Redis
is down. ``call_within`` runs one call under a deadline and turns a timeout, a Redis error or a network error
into the caller's "unavailable" exception (``IndexUnavailable``, ``SharedLoadUnavailable``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError
from redis.retry import Retry

RedisClient = aioredis.Redis | aioredis.RedisCluster  # what the index, the shared load and the leases run on
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")  # a URL with one of these talks to a Redis Cluster

T = TypeVar("T")


def redis_client(url: str, **kwargs: Any) -> RedisClient:
    """A client for ``url``, without connecting (``kwargs`` go to redis-py's ``from_url``)."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in CLUSTER_SCHEMES:
        return aioredis.RedisCluster.from_url(scheme[: -len("+cluster")] + "://" + rest, **kwargs)
    return aioredis.Redis.from_url(url, **kwargs)


def client_for(url: str, timeout_s: float) -> RedisClient:
    """A bytes client for ``url`` whose sockets give up after ``timeout_s``, with one quick retry for a stale
    pooled connection: what the prefix index, the leases and the shared load run on."""
    return redis_client(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), retries=1),
        decode_responses=False,
    )


async def call_within(
    client: RedisClient, awaitable: Awaitable[T], timeout_s: float, unavailable: type[Exception]
) -> T:
    """Await one Redis call of ``client`` under ``timeout_s``; every failure raises ``unavailable`` (with the reason).

    A cluster client learns the slot map first (once; concurrent first calls wait for the one that asks). A cold
    redis-py 8.1 cluster client sends a keyed script to its default node, which answers MOVED, and on every 5th
    MOVED it closes all its connections, the other in-flight calls' included: 32 concurrent first calls on a
    fresh client lost about a third of them that way (``tests/contract/test_shared_load.py``)."""
    try:
        async with asyncio.timeout(timeout_s):
            if isinstance(client, aioredis.RedisCluster):
                await client.initialize()
            return await awaitable
    except TimeoutError:
        raise unavailable(f"redis: no answer within {timeout_s}s") from None
    except (RedisError, RedisClusterException, OSError) as exc:  # the cluster's own are not RedisErrors
        raise unavailable(f"redis: {type(exc).__name__}: {exc}") from exc
    finally:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # a call that never started (initialize failed) must not warn "never awaited"
