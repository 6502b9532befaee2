"""SharedLoad against a real valkey-server: replicas see each other's in-flight prefill; it drains by itself."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from extproc.redis.shared_load import SharedLoad, SharedLoadUnavailable
from extproc.types import EndpointId

pytestmark = pytest.mark.redis

A, B = EndpointId("10.0.0.1:8000"), EndpointId("10.0.0.2:8000")


def replica(url: str, ns: str, rate: float = 1000.0) -> SharedLoad:
    return SharedLoad.from_url(url, namespace=ns, prefill_tokens_per_s=rate, timeout_s=0.5)


async def test_two_replicas_share_and_drain(server_url: str) -> None:
    ns = uuid.uuid4().hex[:8]
    one, two = replica(server_url, ns), replica(server_url, ns)
    try:
        await one.add(A, 2000)
        await two.add(A, 1000)
        seen = await two.queued([A, B])
        assert 2700 < seen[A] <= 3000 and seen[B] == 0
        await asyncio.sleep(0.5)  # drains at 1000 tokens/s
        later = await one.queued([A])
        assert later[A] < seen[A] - 300
        await one.forget(A)
        assert (await one.queued([A]))[A] == 0
    finally:
        await one.close()
        await two.close()


async def test_a_burst_from_two_replicas_adds_up_atomically(server_url: str) -> None:
    ns = uuid.uuid4().hex[:8]
    replicas = [replica(server_url, ns, rate=1.0), replica(server_url, ns, rate=1.0)]
    try:
        await asyncio.gather(*(replicas[i % 2].add(A, 100) for i in range(64)))
        assert (await replicas[0].queued([A]))[A] == pytest.approx(6400, abs=5)
    finally:
        for r in replicas:
            await r.close()


async def test_unreachable_redis_is_a_typed_error_within_the_deadline() -> None:
    dead = SharedLoad.from_url("redis://127.0.0.1:1/0", namespace="x", prefill_tokens_per_s=1.0, timeout_s=0.2)
    try:
        with pytest.raises(SharedLoadUnavailable):
            await dead.queued([A])
        with pytest.raises(SharedLoadUnavailable):
            await dead.add(A, 5)
    finally:
        await dead.close()
