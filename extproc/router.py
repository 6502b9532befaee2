"""``Router.route()``: every await happens here (prepare, hash, lookup), then one pure decision.

Read path per request: classify (by the parser's paths) → parse + render + tokenize (off the event loop) → hash
blocks → look the blocks up (precise and approximate indexes, each under a deadline) → build frozen candidates
→ the profile decides → record what we routed (in-flight load, approximate index) → one structured log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from extproc import wire
from extproc.backends.inflight import InflightLoad
from extproc.backends.load import snapshot
from extproc.backends.registry import EndpointRecord, EndpointRegistry
from extproc.errors import NoEndpoint, RouterError
from extproc.kvcache.hashing import Unhashable
from extproc.kvcache.index import Chain, IndexUnavailable, PrefixIndex
from extproc.observability import PhaseTimer, RouterMetrics
from extproc.redis.shared_load import SharedLoad, SharedLoadUnavailable
from extproc.scheduling.filters import eligible
from extproc.scheduling.profiles import Profile
from extproc.types import (
    BlockHash,
    Candidate,
    Decision,
    EndpointId,
    HashScheme,
    HttpRequest,
    LoraAdapter,
    PassThrough,
    PreparedPrompt,
    Route,
    RoutingRequest,
    Tenant,
)

log = logging.getLogger("extproc.decision")
_log = logging.getLogger(__name__)  # not decision lines: what went wrong on the way to one

_LOGGED_BODY_BYTES = 512
_INLINE_HASH_BLOCKS = 256  # more uncached blocks than this (~0.6 ms+) are hashed off the event loop
_SERVED_MEMORY = 1024  # picks remembered until Envoy reports the served endpoint (oldest forgotten first)
_FROM_ROOT = Chain.from_root()  # a prompt's block hashes start at its first block
_MISSED_LOG_EVERY_S = 10.0  # a lookup that missed its deadline is logged at INFO at most this often per index
_DRAIN_S = 1.0  # how long ``drain`` lets background writes finish before cancelling them


class Preparer(Protocol):
    def parses(self, path: str) -> bool:
        """Whether ``path`` is one the parser understands (an OpenAI completions path); others pass through."""
        ...

    async def prepare(self, request: HttpRequest, tokenize_within_s: float | None = None) -> PreparedPrompt:
        """Parse, resolve the model, render and tokenize (within ``tokenize_within_s``; <= 0: skip it).
        Raises RouterError for bad input; a tokenizer failure is not an error (``token_ids`` None)."""
        ...


class PendingHashes(Protocol):
    """A prompt's hashing, looked up but not finished: ``missing_blocks`` still need SHA-256."""

    @property
    def missing_blocks(self) -> int: ...


class Hasher(Protocol):
    """Block hashing in two steps, so the router can run the expensive one off the event loop."""

    def start(
        self, scheme: HashScheme, tokens: Sequence[int], lora: LoraAdapter | None, salt: str | None
    ) -> PendingHashes:
        """Cheap: find what is known (a prefix cache), hash nothing."""
        ...

    def finish(self, scheme: HashScheme, pending: PendingHashes) -> list[BlockHash]:
        """Hash what is missing; every full block's key, in order."""
        ...


@dataclass(frozen=True, slots=True)
class RouterSettings:
    stale_after_s: float = 2.0
    lookup_deadline_s: float = 0.005
    approx_ttl_s: float = 600.0
    burst_mark_ttl_s: float = 2.0
    tenant_header: str = wire.TENANT_HEADER
    max_blocks: int = 8192
    log_prompts: bool = False  # the decision line carries the body's first bytes (prompt text): opt-in only
    use_index: bool = True  # False: load-only routing (no hashing, no lookups)
    track_served: bool = False  # remember picks so ``on_served`` can compare (GIE response path)
    # A request older than this (since its first ext_proc message) is routed by load at once: Envoy's message
    # timeout (2 s in our configs) must never expire on a busy picker, which would fail the request open.
    answer_budget_s: float = 0.5


@dataclass(frozen=True, slots=True)
class RouterDeps:
    """What the router reads and writes; built by the composition root."""

    preparer: Preparer
    hasher: Hasher
    scheme_for: Callable[[str], HashScheme]  # base model → its pool's hash scheme
    tenant_for: Callable[[str], Tenant]  # tenant id → class
    registry: EndpointRegistry
    inflight: InflightLoad
    precise: PrefixIndex
    approx: PrefixIndex
    # the endpoints with a live, trusted, confirmed event stream: taken once per request (one snapshot)
    precise_endpoints: Callable[[], frozenset[EndpointId]]
    profile: Profile
    metrics: RouterMetrics
    executor: Executor  # for hashing long prompts: its own thread, never queued behind tokenization
    shared_load: SharedLoad | None = None  # in-flight load shared with the other replicas (Redis)
    # endpoint's events will report what it stores (even while cold after a purge); None: precise ones
    has_live_events: Callable[[EndpointId], bool] | None = None
    diagnose: Callable[[RoutingRequest], None] | None = None  # once per routed request (it samples)


class Router:
    """Implements the ext_proc adapter's ``RouteHandler``."""

    def __init__(
        self,
        deps: RouterDeps,
        settings: RouterSettings,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deps = deps
        self._settings = settings
        self._rng = rng or random.Random()
        self._clock = clock
        self._background: set[asyncio.Task[None]] = set()
        self._missed: dict[str, tuple[float, int]] = {}  # index name -> (last INFO line at, misses since)
        # {request_id: (primary pick, its block hashes)}, bounded by _SERVED_MEMORY
        self._picked: OrderedDict[str, tuple[EndpointId, Sequence[BlockHash]]] = OrderedDict()

    async def route(self, request: HttpRequest) -> Route | PassThrough:
        """Decide where ``request`` goes. Raises RouterError (mapped to an HTTP error by the adapter)."""
        if request.method != "POST" or not self._deps.preparer.parses(request.path):
            return PassThrough()
        if not request.body and request.subset is None:
            # Nothing to route on: Envoy decided at the headers (body mode NONE, STREAMED or GRPC, where the
            # body never reaches us) or the client sent none. Envoy's own balancing serves it; a backend
            # answers an empty body itself. (Refusing it would refuse every request of a header-only setup.)
            return PassThrough()
        timer = PhaseTimer(self._clock)
        try:
            decision, routing, precise = await self._decide(request, timer)
        except RouterError as exc:
            self._deps.metrics.rejections.labels(str(exc.status)).inc()
            log.info(json.dumps({"request_id": request.request_id, "rejected": exc.status, "error": exc.message}))
            raise
        self._record(routing, decision, precise)
        if self._settings.track_served:
            self._remember(request.request_id, decision.endpoints[0], routing.block_hashes)
        timer.mark("total_end")
        self._observe(request, routing, decision, timer)
        return Route(
            decision.endpoints,
            {
                wire.REASON_HEADER: decision.reason.value,
                wire.CACHED_TOKENS_HEADER: str(decision.cached_tokens),
                wire.PROMPT_TOKENS_HEADER: str(routing.prompt_tokens),
            },
        )

    async def _decide(
        self, request: HttpRequest, timer: PhaseTimer
    ) -> tuple[Decision, RoutingRequest, frozenset[EndpointId]]:
        prepared = await self._deps.preparer.prepare(request, self._tokenize_budget(request))
        timer.mark("tokenize", split_first=("parse", prepared.parse_s))
        scheme = self._deps.scheme_for(prepared.base_model)
        hashes = await self._hash(scheme, prepared)
        timer.mark("hash")
        tenant_id = request.headers.get(self._settings.tenant_header, "")
        routing = RoutingRequest(
            request_id=request.request_id,
            model=prepared.model,
            base_model=prepared.base_model,
            lora=prepared.lora,
            prompt_tokens=len(prepared.token_ids or ()),
            block_hashes=hashes,
            block_size=scheme.block_size,
            tenant=self._deps.tenant_for(tenant_id),
            subset=frozenset(request.subset) if request.subset is not None else None,
            token_ids=prepared.token_ids,
        )
        states = self._deps.registry.snapshot()
        endpoints = eligible((s.endpoint for s in states.values()), routing.base_model, routing.lora, routing.subset)
        if not endpoints:
            raise NoEndpoint("no eligible endpoint serves this model")
        ids = [e.id for e in endpoints]
        precise = self._deps.precise_endpoints()  # one view for the whole request
        matches, shared = await asyncio.gather(self._lookup(hashes, ids, precise), self._shared_queued(ids))
        timer.mark("lookup")
        candidates = [
            self._candidate(states[e.id], matches.get(e.id, 0), shared.get(e.id, 0.0), e.id in precise)
            for e in endpoints
        ]
        decision = self._deps.profile.decide(routing, candidates, self._rng)
        timer.mark("score")
        return decision, routing, precise

    def _tokenize_budget(self, request: HttpRequest) -> float | None:
        """Seconds left for tokenizing (the answer budget less the time since the first message), or None when
        the adapter did not say when the request arrived. The lookups after it keep their own deadlines."""
        if request.received_at_s is None:
            return None
        left = self._settings.answer_budget_s - (self._clock() - request.received_at_s)
        if left <= 0:
            self._deps.metrics.late_requests.inc()
        return left

    async def _hash(self, scheme: HashScheme, prepared: PreparedPrompt) -> list[BlockHash]:
        tokens = prepared.token_ids
        if not tokens or not self._settings.use_index:
            return []
        tokens = tokens[: self._settings.max_blocks * scheme.block_size]
        try:
            pending = self._deps.hasher.start(scheme, tokens, prepared.lora, prepared.cache_salt)
            if pending.missing_blocks <= _INLINE_HASH_BLOCKS:
                return self._deps.hasher.finish(scheme, pending)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._deps.executor, self._deps.hasher.finish, scheme, pending)
        except Unhashable as exc:  # no block keys exist for this request (nor in vLLM): routed by load
            log.debug("request without block keys, routing by load: %s", exc)
            return []

    async def _lookup(
        self, hashes: Sequence[BlockHash], endpoints: Sequence[EndpointId], precise: frozenset[EndpointId]
    ) -> dict[EndpointId, int]:
        """Leading cached blocks per endpoint: event-fed endpoints from the precise index (plus our short-lived
        burst marks), the others from the approximate index. A slow or failed index counts as no match."""
        if not hashes:
            return {}
        deadline_s = self._settings.lookup_deadline_s
        # The approximate index answers from memory (a Redis mirror, if any, has its own shorter timeout inside),
        # so it gets twice the deadline: a busy event loop must not throw our own guesses away with the mirror.
        exact, approx = await asyncio.gather(
            self._match("precise", self._deps.precise, hashes, [e for e in endpoints if e in precise], deadline_s),
            self._match("approx", self._deps.approx, hashes, endpoints, 2 * deadline_s),
        )
        return {e: max(exact.get(e, 0), approx.get(e, 0)) for e in endpoints}

    async def _match(
        self,
        name: str,
        index: PrefixIndex,
        hashes: Sequence[BlockHash],
        endpoints: Collection[EndpointId],
        deadline_s: float,
    ) -> Mapping[EndpointId, int]:
        """``index``'s leading matches within ``deadline_s``; a miss is counted (label ``name``) as no match."""
        if not endpoints:
            return {}
        try:
            return await asyncio.wait_for(index.match(hashes, endpoints), deadline_s)
        except (TimeoutError, IndexUnavailable) as exc:
            self._deps.metrics.index_failures.labels(name).inc()
            self._lookup_missed(name, exc)
            return {}

    async def _shared_queued(self, endpoints: Sequence[EndpointId]) -> Mapping[EndpointId, float]:
        """Every replica's in-flight prefill per endpoint (shared load), or {} when unshared or unavailable."""
        if self._deps.shared_load is None:
            return {}
        try:
            return await asyncio.wait_for(self._deps.shared_load.queued(endpoints), self._settings.lookup_deadline_s)
        except (TimeoutError, SharedLoadUnavailable) as exc:
            self._deps.metrics.index_failures.labels("shared_load").inc()
            self._lookup_missed("shared_load", exc)
            return {}

    def _lookup_missed(self, name: str, exc: Exception) -> None:
        """A lookup past its deadline (or failed) moves requests away from their cached prefix: say so at INFO,
        at most once per ``_MISSED_LOG_EVERY_S`` per index, with how many were missed meanwhile."""
        now = self._clock()
        last, missed = self._missed.get(name, (float("-inf"), 0))
        if now - last < _MISSED_LOG_EVERY_S:
            self._missed[name] = (last, missed + 1)
            return
        self._missed[name] = (now, 0)
        why = f"no answer within {self._settings.lookup_deadline_s}s" if isinstance(exc, TimeoutError) else str(exc)
        _log.info("%s lookup failed (%s): routed as if nothing were cached there; %d more since the last such line",
                  name, why, missed)  # fmt: skip

    def _candidate(
        self, record: EndpointRecord, cached_blocks: int, shared_queued: float = 0.0, precise: bool = False
    ) -> Candidate:
        load = snapshot(record, self._deps.inflight, shared_queued, self._clock(), self._settings.stale_after_s)
        return Candidate(record.endpoint, load, cached_blocks, precise=precise)

    def _record(self, routing: RoutingRequest, decision: Decision, precise: frozenset[EndpointId]) -> None:
        """What we just routed becomes load and (approximate) cache state on the pick, before the next request."""
        pick = decision.endpoints[0]
        uncached = max(routing.prompt_tokens - decision.cached_tokens, 0)
        self._deps.inflight.add(pick, uncached)
        if self._deps.shared_load is not None:
            self._spawn(self._deps.shared_load.add(pick, uncached))
        if routing.block_hashes:
            # Where events will report the blocks (a cold event-fed endpoint included), our record only bridges
            # the moment until they do: a short burst mark, never a 600 s guess that its BlockRemoved cannot undo.
            live = self._deps.has_live_events(pick) if self._deps.has_live_events else pick in precise
            ttl = self._settings.burst_mark_ttl_s if live else self._settings.approx_ttl_s
            self._spawn(self._deps.approx.store(pick, routing.block_hashes, ttl_s=ttl, chain=_FROM_ROOT))

    def _remember(self, request_id: str, pick: EndpointId, hashes: Sequence[BlockHash]) -> None:
        self._picked[request_id] = (pick, hashes)
        if len(self._picked) > _SERVED_MEMORY:
            self._picked.popitem(last=False)

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        """Envoy reports the endpoint that really served ``request_id`` (GIE "destination endpoint served").

        When: on the response headers, if ``track_served`` is on and the stream was kept open. A fallback
        (served != primary pick) is counted and logged, and the prompt's blocks are recorded as cached on the
        endpoint that served them.
        """
        entry = self._picked.pop(request_id, None)
        if entry is None:
            return
        pick, hashes = entry
        if endpoint == pick:
            self._deps.metrics.served.labels("picked").inc()
            return
        self._deps.metrics.served.labels("fallback").inc()
        log.info(json.dumps({"request_id": request_id, "picked": pick, "served": endpoint}))
        if hashes and endpoint in self._deps.registry.snapshot():
            self._spawn(self._deps.approx.store(endpoint, hashes, ttl_s=self._settings.approx_ttl_s, chain=_FROM_ROOT))

    async def drain(self) -> None:
        """Let the background writes (approximate index, shared load) finish, bounded, then cancel the rest.
        When: at shutdown, after the server stopped taking requests."""
        tasks = list(self._background)
        if tasks:
            await asyncio.wait(tasks, timeout=_DRAIN_S)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _spawn(self, coro: object) -> None:
        async def run() -> None:
            try:
                await coro  # type: ignore[misc]
            except Exception as exc:  # best-effort writes: approximate index, shared load
                log.debug("background write failed: %s", exc)

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _observe(self, request: HttpRequest, routing: RoutingRequest, decision: Decision, timer: PhaseTimer) -> None:
        m = self._deps.metrics
        m.decisions.labels(decision.reason.value).inc()
        m.cached_tokens.inc(decision.cached_tokens)
        m.prompt_tokens.inc(routing.prompt_tokens)
        for phase, seconds in timer.phases().items():
            m.phase_seconds.labels(phase).observe(seconds)
        if self._deps.diagnose is not None:
            self._deps.diagnose(routing)
        if log.isEnabledFor(logging.INFO):
            head = request.body[:_LOGGED_BODY_BYTES]
            extra = {"body_head": head.decode(errors="replace")} if self._settings.log_prompts else {}
            log.info(
                json.dumps(
                    {
                        **extra,
                        "request_id": request.request_id,
                        "model": routing.model,
                        "tenant": routing.tenant.id,
                        "endpoint": decision.endpoints[0],
                        "fallbacks": decision.endpoints[1:],
                        "reason": decision.reason.value,
                        "prompt_tokens": routing.prompt_tokens,
                        "cached_tokens": decision.cached_tokens,
                        "estimates_s": {e: round(v, 4) for e, v in decision.estimates_s.items()},
                        "scores": {e: round(v, 4) for e, v in decision.scores.items()},
                        "ms": {k: round(v * 1000, 3) for k, v in timer.phases().items()},
                    }
                )
            )
