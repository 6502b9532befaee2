"""In-flight load shared by every picker replica: one virtual prefill queue per endpoint, kept in Redis.

Each replica adds the uncached prompt tokens of what it routes; the queue drains at the endpoint's prefill
rate, computed server-side from Redis ``TIME`` so replicas need no synchronised clocks. Every call is one
script call (one round trip; ``lua/shared_load.lua``): ``read`` the candidates' queues, ``add`` to one, or
``reserve``: add to the pick *only if* nobody reserved there since this replica read it, else answer with
every candidate's fresh queue so the replica decides again (``docs/scheduling.md``, "Replicas as one").

Each queue carries a **version**, bumped by every reservation on it (draining never bumps it): a replica that
decided on version v of its pick's queue and finds v still there knows its decision saw every other replica's
reservation on that endpoint. (A reservation elsewhere only makes the other candidates worse, never the pick.)

A reservation also carries its request's predicted first token, and each endpoint answers with how long the
latest of those is still ahead (``SharedQueues.busy_s``): the engine prefills one step at a time, so a request
arriving while another replica's is predicted to prefill starts after it, whatever the token queue drained
(the estimate's busy floor, which each replica otherwise knows only for its own requests).

A reservation expires by itself (it drains away), which bounds the damage of a replica that dies mid-burst.
If Redis is slow or down, callers fall back to their own replica-local ``InflightLoad``.

Key: ``{ns}:load`` (``schema.py``; the hash tag keeps it on one Redis Cluster slot, like the prefix index's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extproc.redis.client import RedisClient, call_within, client_for
from extproc.redis.schema import Schema
from extproc.redis.scripts import source
from extproc.types import EndpointId

ANY_VERSION = -1  # ``reserve``'s version that matches whatever is there: reserve unconditionally


class SharedLoadUnavailable(Exception):
    """Redis did not answer in time: use this replica's own view."""


@dataclass(frozen=True, slots=True)
class SharedQueues:
    """Every replica's queued prefill per endpoint at one moment, ``{endpoint: tokens}``, each queue's version
    ``{endpoint: reservations so far}`` (0 for an endpoint nobody reserved on), and ``{endpoint: seconds}``
    until the latest predicted first token any replica reserved there (0 or absent: none ahead)."""

    tokens: Mapping[EndpointId, float]
    versions: Mapping[EndpointId, int]
    busy_s: Mapping[EndpointId, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``reserve`` did: ``reserved`` or not (a stale version), and the candidates' queues after it."""

    reserved: bool
    queues: SharedQueues


class SharedQueue(Protocol):
    """The shared load as the decider uses it; ``SharedLoad`` on Redis (tests have an in-memory fake, run
    through the same contract suite). Every method raises SharedLoadUnavailable."""

    async def read(self, endpoints: Sequence[EndpointId]) -> SharedQueues:
        """Every endpoint's queued prefill tokens and version now."""
        ...

    async def add(self, endpoint: EndpointId, tokens: int, busy_s: float = 0.0) -> None:
        """Reserve ``tokens`` of prefill on ``endpoint``, whatever its version; ``busy_s``: its predicted first
        token is that far ahead (0: not estimated), so the endpoint reads busy until then."""
        ...

    async def reserve(
        self, pick: EndpointId, tokens: int, version: int, endpoints: Sequence[EndpointId], busy_s: float = 0.0
    ) -> Reservation:
        """Reserve ``tokens`` (and ``busy_s``, as ``add``) on ``pick`` if its version is still ``version``
        (``ANY_VERSION``: in any case); answer with ``endpoints``' queues after it, in the same step (atomic across
        replicas)."""
        ...

    async def forget(self, endpoint: EndpointId) -> None:
        """Drop ``endpoint``'s queue (it left the pool)."""
        ...


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

    async def read(self, endpoints: Sequence[EndpointId]) -> SharedQueues:
        if not endpoints:
            return SharedQueues({}, {})
        return (await self._run("", 0, ANY_VERSION, endpoints, 0.0)).queues

    async def queued(self, endpoints: Sequence[EndpointId]) -> Mapping[EndpointId, float]:
        """Every endpoint's queued prefill tokens now (``read`` without the versions)."""
        return (await self.read(endpoints)).tokens

    async def add(self, endpoint: EndpointId, tokens: int, busy_s: float = 0.0) -> None:
        if tokens > 0:
            await self._run(endpoint, tokens, ANY_VERSION, [endpoint], busy_s)

    async def reserve(
        self, pick: EndpointId, tokens: int, version: int, endpoints: Sequence[EndpointId], busy_s: float = 0.0
    ) -> Reservation:
        listed = endpoints if pick in endpoints else [pick, *endpoints]
        return await self._run(pick, tokens, version, listed, busy_s)

    async def forget(self, endpoint: EndpointId) -> None:
        await self._call(self._r.hdel(self._key, endpoint, Schema.busy_field(endpoint)))

    async def close(self) -> None:
        await self._r.aclose()

    async def _run(
        self, pick: str, tokens: int, version: int, endpoints: Sequence[EndpointId], busy_s: float
    ) -> Reservation:
        busy_ms = max(round(busy_s * 1000), 0)
        args: list[str | int | float] = [self._rate, pick, max(tokens, 0), version, busy_ms, *endpoints]
        out = await self._call(self._script(keys=[self._key], args=args))
        tokens_by, versions, busy_by = {}, {}, {}
        for k, e in enumerate(endpoints):
            tokens_by[e], versions[e] = float(out[1 + 3 * k]), int(out[2 + 3 * k])
            busy_by[e] = int(out[3 + 3 * k]) / 1000
        return Reservation(out[0] in (b"1", "1"), SharedQueues(tokens_by, versions, busy_by))

    async def _call(self, awaitable: Any) -> Any:
        return await call_within(self._r, awaitable, self._timeout_s, SharedLoadUnavailable)
