"""``Router.route()``: the front half of a pick (classify, parse + render + tokenize, hash), then the decider.

Read path per request: classify (by the parser's paths) → parse + render + tokenize (off the event loop for long
bodies) → hash blocks → hand an ``Ask`` to the ``Decider`` (``extproc.decider``: lookups, the pure decision,
recording, the decision line). In one picker process the decider is a ``LocalDecider`` on the same loop; with
front workers (``extproc.workers``) each worker process runs a ``Router`` whose decider is the main process's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol

from extproc import wire
from extproc.decider import Ask, Decider, DeciderSettings, SchemeChanged, count_rejection
from extproc.errors import RouterError
from extproc.kvcache.hashing import Unhashable
from extproc.observability import PhaseTimer, RouterMetrics
from extproc.types import (
    BlockHash,
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

_LOGGED_BODY_BYTES = 512
_INLINE_HASH_BLOCKS = 256  # more uncached blocks than this (~0.6 ms+) are hashed off the event loop


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
    """The front half's settings, and the decider's (``decider``: one home for each)."""

    tenant_header: str = wire.TENANT_HEADER
    max_blocks: int = 8192
    use_index: bool = True  # False: load-only routing (no hashing, no lookups)
    # A request older than this (since its first ext_proc message) is routed by load at once: Envoy's message
    # timeout (2 s in our configs) must never expire on a busy picker, which would fail the request open.
    answer_budget_s: float = 0.5
    decider: DeciderSettings = DeciderSettings()


@dataclass(frozen=True, slots=True)
class FrontDeps:
    """What the front half uses: the parser/tokenizer, the block hasher, the scheme table, its metrics."""

    preparer: Preparer
    hasher: Hasher
    scheme_for: Callable[[str], HashScheme]  # base model → the hash scheme to use (the decider may correct it)
    metrics: RouterMetrics
    executor: Executor  # for hashing long prompts: its own thread, never queued behind tokenization
    diagnose: Callable[[RoutingRequest], None] | None = None  # once per routed request (it samples)


class Router:
    """Implements the ext_proc adapter's ``RouteHandler``: the front half, then ``decider``."""

    def __init__(
        self,
        deps: FrontDeps,
        decider: Decider,
        settings: RouterSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        ahead_of_body: Callable[[], None] | None = None,
    ) -> None:
        self._deps = deps
        self.decider = decider
        self._settings = settings
        self._clock = clock
        self._ahead_of_body = ahead_of_body

    def body_coming(self) -> None:
        """``BodyListener``: a request's body is on its way. Runs ``ahead_of_body`` (in one picker process: the
        load answers that arrived are read now, in the round trip to Envoy, not on the decision's path)."""
        if self._ahead_of_body is not None:
            self._ahead_of_body()

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
            prepared = await self._deps.preparer.prepare(request, self._tokenize_budget(request))
        except RouterError as exc:
            count_rejection(self._deps.metrics, request.request_id, exc)
            raise
        timer.mark("tokenize", split_first=("parse", prepared.parse_s))
        scheme = self._deps.scheme_for(prepared.base_model)
        hashes = await self._hash(scheme, prepared)
        timer.mark("hash")
        ask = self._ask(request, prepared, scheme, hashes, timer)
        try:
            route = await self.decider.decide(ask)
        except SchemeChanged as changed:  # the pool's scheme became known (or changed) meanwhile: hash again
            hashes = await self._hash(changed.scheme, prepared)
            timer.mark("hash")
            ask = self._ask(request, prepared, changed.scheme, hashes, timer)
            route = await self.decider.decide(ask)
        if self._deps.diagnose is not None and isinstance(route, Route):
            self._deps.diagnose(ask.routing(Tenant(ask.tenant_id), prepared.token_ids))
        return route

    def _ask(
        self,
        request: HttpRequest,
        prepared: PreparedPrompt,
        scheme: HashScheme,
        hashes: list[BlockHash],
        timer: PhaseTimer,
    ) -> Ask:
        return Ask(
            request_id=request.request_id,
            model=prepared.model,
            base_model=prepared.base_model,
            lora=prepared.lora,
            prompt_tokens=len(prepared.token_ids or ()),
            scheme=scheme,
            block_hashes=hashes,
            tenant_id=request.headers.get(self._settings.tenant_header, ""),
            subset=frozenset(request.subset) if request.subset is not None else None,
            phases_s=timer.phases(),
            body_head=request.body[:_LOGGED_BODY_BYTES] if self._settings.decider.log_prompts else b"",
        )

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

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        """Envoy reports the endpoint that really served ``request_id`` (see ``LocalDecider.on_served``)."""
        self.decider.on_served(request_id, endpoint)

    async def drain(self) -> None:
        """Let the decider's background writes finish (bounded). When: at shutdown."""
        await self.decider.drain()
