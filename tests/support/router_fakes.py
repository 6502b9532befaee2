"""Hand-written fakes for ``Router`` unit tests: a preparer, a hasher, a dict-backed index, and
``make_router(...) -> (router, approx index, in-flight load)`` over two endpoints ``A`` and ``B``, both
scraped idle; ``post()`` is a chat request to route."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from extproc.backends.calibration import TtftCalibration
from extproc.backends.hot_blocks import HotBlocks
from extproc.backends.inflight import InflightLoad
from extproc.backends.registry import EndpointRegistry
from extproc.backends.vllm_metrics import EngineMetrics
from extproc.config import SchedulingConfig
from extproc.decider import DeciderDeps, LocalDecider
from extproc.errors import BadRequest
from extproc.kvcache.index import IndexUnavailable
from extproc.kvcache.occupancy import Occupancy
from extproc.observability import RouterMetrics
from extproc.prompt.openai import kind_for_path
from extproc.redis.shared_load import SharedQueue
from extproc.router import FrontDeps, Router, RouterSettings
from extproc.scheduling.build import build_profile, estimator_params
from extproc.scheduling.pd import PdPolicy
from extproc.types import (
    BlockHash,
    Endpoint,
    EndpointId,
    HashScheme,
    HttpRequest,
    LoraAdapter,
    PreparedPrompt,
    Tenant,
)

A, B = EndpointId("127.0.0.1:8001"), EndpointId("127.0.0.1:8002")


class FakePreparer:
    def __init__(self, tokens: list[int] | None) -> None:
        self.tokens = tokens
        self.budgets: list[float | None] = []

    def parses(self, path: str) -> bool:
        return kind_for_path(path) is not None  # the real parser's classification

    async def prepare(self, request: HttpRequest, tokenize_within_s: float | None = None) -> PreparedPrompt:
        self.budgets.append(tokenize_within_s)
        if tokenize_within_s is not None and tokenize_within_s <= 0:
            return PreparedPrompt("m", "m", None, None, None)
        if request.body == b"bad":
            raise BadRequest("bad body")
        return PreparedPrompt("m", "m", None, None, self.tokens)


class FakeHasher:
    """Hash of each block's whole prefix; nothing is ever cached (``missing_blocks`` = every block)."""

    @dataclass
    class Pending:
        tokens: Sequence[int]
        missing_blocks: int

    def start(
        self, scheme: HashScheme, tokens: Sequence[int], lora: LoraAdapter | None, salt: str | None
    ) -> FakeHasher.Pending:
        return FakeHasher.Pending(tokens, len(tokens) // scheme.block_size)

    def finish(self, scheme: HashScheme, pending: FakeHasher.Pending) -> list[BlockHash]:
        size = scheme.block_size
        return [BlockHash(hash(tuple(pending.tokens[: (i + 1) * size]))) for i in range(pending.missing_blocks)]


class DictIndex:
    def __init__(self, fail: bool = False, delay_s: float = 0.0) -> None:
        self.held: dict[EndpointId, set[BlockHash]] = {}
        self.ttls: list[tuple[EndpointId, float | None]] = []  # (endpoint, ttl_s) of every store
        self.fail, self.delay_s = fail, delay_s

    async def match(self, hashes: Sequence[BlockHash], endpoints: Collection[EndpointId]) -> Mapping[EndpointId, int]:
        if self.fail:
            raise IndexUnavailable("down")
        await asyncio.sleep(self.delay_s)
        out = {}
        for e in endpoints:
            n = 0
            while n < len(hashes) and hashes[n] in self.held.get(e, set()):
                n += 1
            out[e] = n
        return out

    async def store(
        self, endpoint: EndpointId, hashes: Sequence[BlockHash], *, ttl_s: float | None = None, **_: object
    ) -> None:
        self.held.setdefault(endpoint, set()).update(hashes)
        self.ttls.append((endpoint, ttl_s))

    async def remove(self, endpoint: EndpointId, hashes: Sequence[BlockHash]) -> None: ...
    async def clear(self, endpoint: EndpointId) -> None: ...
    async def close(self) -> None: ...


def make_router(
    tokens: list[int] | None = None,
    *,
    precise: DictIndex | None = None,
    approx: DictIndex | None = None,
    registry: EndpointRegistry | None = None,
    precise_endpoints: Callable[[], frozenset[EndpointId]] = frozenset,
    settings: RouterSettings | None = None,
    pd: PdPolicy | None = None,
    occupancy: Occupancy | None = None,
    tenant_for: Callable[[str], Tenant] = Tenant,
    shared_load: SharedQueue | None = None,
    calibration: TtftCalibration | None = None,
    fresh_load: Callable[[], None] | None = None,
    hot_blocks: HotBlocks | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Router, DictIndex, InflightLoad]:
    """``shared_load``: the load shared with other replicas (lookups then wait on I/O, as with Redis);
    ``calibration``: learn each endpoint's cost from its scraped TTFT (with the profile's estimator);
    ``fresh_load``: called before each decision reads the registry (the scraper's deferred reads), and when a
    request's body is coming (``Router.body_coming``), as the picker wires it;
    ``hot_blocks``: the blocks recent requests hit per endpoint (None: not tracked); ``clock``: the decider's
    and the in-flight load's."""
    registry = registry or EndpointRegistry([Endpoint(A), Endpoint(B)])
    for eid in registry.snapshot():
        registry.scraped(eid, EngineMetrics(running=0, waiting=0, kv_usage=0.1, models=frozenset({"m"})))
    approx = approx or DictIndex()
    inflight = InflightLoad(10000.0, clock)
    metrics = RouterMetrics(CollectorRegistry())
    front = FrontDeps(
        preparer=FakePreparer(tokens if tokens is not None else list(range(1000))),
        hasher=FakeHasher(),
        scheme_for=lambda m: HashScheme(),
        metrics=metrics,
        executor=ThreadPoolExecutor(1),
    )
    scheduling = SchedulingConfig(prefill_tokens_per_s=10000.0)
    decider = DeciderDeps(
        scheme_for=lambda m: HashScheme(),
        tenant_for=tenant_for,
        registry=registry,
        inflight=inflight,
        precise=precise or DictIndex(),
        approx=approx,
        precise_endpoints=precise_endpoints,
        profile=build_profile(scheduling),
        metrics=metrics,
        pd=pd,
        occupancy=occupancy,
        shared_load=shared_load,
        lookups_wait_on_io=shared_load is not None,
        calibration=calibration,
        estimator=estimator_params(scheduling) if calibration is not None else None,
        fresh_load=fresh_load,
        hot_blocks=hot_blocks,
    )
    settings = settings or RouterSettings()
    local = LocalDecider(decider, settings.decider, rng=random.Random(0), clock=clock)
    return Router(front, local, settings, ahead_of_body=fresh_load), approx, inflight


def post(
    body: bytes = b"{}", path: str = "/v1/chat/completions", subset: tuple[EndpointId, ...] | None = None
) -> HttpRequest:
    return HttpRequest("POST", path, {}, body, "req-1", subset)
