"""The stateful half of a pick: ``LocalDecider.decide(ask)`` looks the blocks up, builds candidates, lets the
profile decide, records what was routed and writes the decision line.

The router's front half (``extproc.router``) parses, renders, tokenizes and hashes; what it hands over is an
``Ask``: small, plain and picklable, so the same decision runs in-process (one picker process) or behind a local
socket for several front worker processes (``extproc.workers``). Every piece of shared state (the indexes, the
in-flight load, the approximate guesses, the profile's memory) lives on this side, once, so N fronts decide as
one picker would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extproc import wire
from extproc.backends.calibration import TtftCalibration
from extproc.backends.hot_blocks import HotBlocks
from extproc.backends.inflight import InflightLoad
from extproc.backends.load import snapshot
from extproc.backends.registry import EndpointRecord, EndpointRegistry
from extproc.decision_line import Observed, merged_phases, observe
from extproc.errors import NoEndpoint, RouterError
from extproc.kvcache.index import Chain, GuessIndex, IndexUnavailable, PrefixIndex
from extproc.kvcache.occupancy import Occupancy
from extproc.observability import PhaseTimer, RouterMetrics
from extproc.redis.shared_load import SharedLoadUnavailable, SharedQueue, SharedQueues
from extproc.reservations import Decided, Reserver, fresher
from extproc.scheduling import pd
from extproc.scheduling.due_calls import DueCalls
from extproc.scheduling.estimate import EstimatorParams, configured_cost, cost_terms
from extproc.scheduling.filters import eligible
from extproc.scheduling.prefix_reuse import PrefixReuse, PromptEnds
from extproc.scheduling.profiles import Profile
from extproc.scheduling.sessions import floor_share
from extproc.tasks import within_or_orphan
from extproc.types import (
    BlockHash,
    Candidate,
    Decision,
    DueCall,
    EndpointId,
    HashScheme,
    LoraAdapter,
    PassThrough,
    Reason,
    Route,
    RoutingRequest,
    Tenant,
    TokenIds,
)

log = logging.getLogger("extproc.decision")
_log = logging.getLogger(__name__)  # not decision lines: what went wrong on the way to one

_SERVED_MEMORY = 1024  # picks remembered until Envoy reports the served endpoint (oldest forgotten first)
_FROM_ROOT = Chain.from_root()  # a prompt's block hashes start at its first block
_MISSED_LOG_EVERY_S = 10.0  # a lookup that missed its deadline is logged at INFO at most this often per index
_DRAIN_S = 1.0  # how long ``drain`` lets background writes finish before cancelling them


@dataclass(frozen=True, slots=True)
class Ask:
    """One request, prepared and hashed by a front: everything the decision needs, nothing it does not.

    ``scheme`` is the hash scheme the front hashed with (the decider refuses an ask hashed with a scheme that
    is no longer the model's: ``SchemeChanged``). ``phases_s`` are the front's phases so far (parse, tokenize,
    hash), for the phase histogram and the decision line; ``body_head`` is empty unless prompts are logged.
    """

    request_id: str
    model: str
    base_model: str
    lora: LoraAdapter | None
    prompt_tokens: int
    scheme: HashScheme
    block_hashes: Sequence[BlockHash]
    tenant_id: str = ""
    subset: frozenset[EndpointId] | None = None
    phases_s: Mapping[str, float] = field(default_factory=dict)
    body_head: bytes = b""

    def routing(
        self,
        tenant: Tenant,
        token_ids: TokenIds | None = None,
        *,
        followers: float = 1.0,
        chains: float = 0.0,
        measured: float = 1.0,
    ) -> RoutingRequest:
        """The request as the decision (and the diagnostics, with ``token_ids``) read it; ``followers``,
        ``chains`` and ``measured``: the decider's measures of how often new prefixes were followed and how long
        chains ran lately, and how full their window is (``RoutingRequest.prefix_followers``,
        ``chain_followers``, ``chains_measured``)."""
        return RoutingRequest(
            request_id=self.request_id, model=self.model, base_model=self.base_model, lora=self.lora,
            prompt_tokens=self.prompt_tokens, block_hashes=self.block_hashes, block_size=self.scheme.block_size,
            tenant=tenant, subset=self.subset, token_ids=token_ids, prefix_followers=followers,
            chain_followers=chains, chains_measured=measured,
        )  # fmt: skip


def count_rejection(metrics: RouterMetrics, request_id: str, exc: RouterError) -> None:
    """A refused request: counted by status and logged as one decision line (either half of the router)."""
    metrics.rejections.labels(str(exc.status)).inc()
    log.info(json.dumps({"request_id": request_id, "rejected": exc.status, "error": exc.message}))


class SchemeChanged(Exception):
    """The ask was hashed with another scheme than the model's current one (``scheme``): hash again."""

    def __init__(self, scheme: HashScheme) -> None:
        super().__init__(f"hash scheme is now {scheme}")
        self.scheme = scheme


class Decider(Protocol):
    """Where a front sends its asks: in-process (``LocalDecider``) or over a socket (``workers.RemoteDecider``)."""

    async def decide(self, ask: Ask) -> Route | PassThrough:
        """The pick for ``ask`` (PassThrough: no decision could be had, Envoy balances). Raises RouterError (the
        request is refused) or SchemeChanged."""
        ...

    def on_served(self, request_id: str, endpoint: EndpointId) -> None:
        """Envoy reports the endpoint that really served ``request_id``."""
        ...

    async def drain(self) -> None:
        """Let background writes finish (bounded); at shutdown."""
        ...


@dataclass(frozen=True, slots=True)
class DeciderSettings:
    stale_after_s: float = 2.0
    lookup_deadline_s: float = 0.005
    approx_ttl_s: float = 600.0
    burst_mark_ttl_s: float = 2.0
    log_prompts: bool = False  # the decision line carries the body's first bytes (prompt text): opt-in only
    track_served: bool = False  # remember picks so ``on_served`` can compare (GIE response path)
    reserve_redecisions: int = 3  # with a shared load: decisions again after another replica reserved first
    share_busy: bool = True  # with a shared load: reservations carry the predicted first token, read as busy floors


@dataclass(frozen=True, slots=True)
class DeciderDeps:
    """What the decision reads and writes; built by the composition root."""

    scheme_for: Callable[[str], HashScheme]  # base model → its pool's hash scheme
    tenant_for: Callable[[str], Tenant]  # tenant id → class
    registry: EndpointRegistry
    inflight: InflightLoad
    precise: PrefixIndex
    approx: GuessIndex  # our own routing's guesses and burst marks
    # the endpoints with a live, trusted, confirmed event stream: taken once per request (one snapshot)
    precise_endpoints: Callable[[], frozenset[EndpointId]]
    profile: Profile
    metrics: RouterMetrics
    shared_load: SharedQueue | None = None  # in-flight load shared with the other replicas (Redis)
    # endpoint's events will report what it stores (even while cold after a purge); None: precise ones
    has_live_events: Callable[[EndpointId], bool] | None = None
    lookups_wait_on_io: bool = False  # True (Redis): the lookups run concurrently; False (memory): in turn
    pd: pd.PdPolicy | None = None  # prefill/decode disaggregation (engages only with prefill-role endpoints)
    occupancy: Occupancy | None = None  # the cache by tenant class (kvcache/occupancy.py); None: not kept
    hot_blocks: HotBlocks | None = None  # per endpoint, the cached blocks recent requests hit (a copy's bound)
    calibration: TtftCalibration | None = None  # predicted vs the engine's TTFT, per endpoint; the learned costs
    estimator: EstimatorParams | None = None  # the configured estimate's constants (the terms the calibration learns)
    fresh_load: Callable[[], None] | None = None  # applies the load answers that have arrived (deferred reads)
    on_due_call: Callable[[DueCall], None] | None = None  # tells the other replicas each call routed (its chain's next)


class LocalDecider:
    """Implements ``Decider`` on this process's state. Not thread-safe: call it from the event loop."""

    def __init__(
        self,
        deps: DeciderDeps,
        settings: DeciderSettings,
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
        self._reserver: Reserver | None = None
        self._serial = asyncio.Lock()  # with a shared load: one decide-reserve-record at a time (``_decide``)
        self._known = SharedQueues({}, {})  # the shared queues our last reservation answered with
        self._reuse = PrefixReuse()  # how often new prefixes were followed lately: the cold placement's window
        self._prompt_ends = PromptEnds()  # what a chain's next call extends, and when it was routed
        self._due = DueCalls()  # where and when chains' next calls are expected
        if deps.shared_load is not None:
            self._reserver = Reserver(deps.shared_load, deadline_s=settings.lookup_deadline_s,
                                      redecisions=settings.reserve_redecisions, orphans=self._background)  # fmt: skip

    async def decide(self, ask: Ask) -> Route:
        current = self._deps.scheme_for(ask.base_model)
        if ask.block_hashes and current != ask.scheme:
            raise SchemeChanged(current)
        timer = PhaseTimer(self._clock)
        reuse = self._reuse
        routing = ask.routing(
            self._deps.tenant_for(ask.tenant_id),
            followers=reuse.followers(),
            chains=reuse.chain_followers(self._clock()),
            measured=reuse.measured(),
        )
        try:
            decision, split = await self._decide(routing, timer)
        except RouterError as exc:
            count_rejection(self._deps.metrics, ask.request_id, exc)
            raise
        if self._settings.track_served:
            self._remember(ask.request_id, decision.endpoints[0], routing.block_hashes)
        timer.mark("total_end")
        phases = merged_phases(ask.phases_s, timer.phases())
        seen = Observed(routing, decision, split, phases, self._ttft_ratio(decision.endpoints[0]), ask.body_head)
        observe(self._deps.metrics, seen, log_prompts=self._settings.log_prompts)
        headers = {
            wire.REASON_HEADER: decision.reason.value,
            wire.CACHED_TOKENS_HEADER: str(decision.cached_tokens),
            wire.PROMPT_TOKENS_HEADER: str(routing.prompt_tokens),
        }
        if split is not None and split.prefill is not None:
            headers[wire.PREFILLER_HEADER] = split.prefill
        return Route(decision.endpoints, headers)

    async def _decide(self, routing: RoutingRequest, timer: PhaseTimer) -> Decided:
        """Look up, decide and record: the decision and the P/D choice. With a shared load the decision, its
        atomic reservation (``extproc.reservations``) and the record run as one step per replica
        (``_serial``), so this replica's next decision sees the last one's load and hot blocks, as with one
        replica in memory, where no await separates a decision from its record."""
        if self._deps.fresh_load is not None:
            self._deps.fresh_load()
        states = self._deps.registry.snapshot()
        endpoints = eligible((s.endpoint for s in states.values()), routing.base_model, routing.lora, routing.subset)
        if not endpoints:
            raise NoEndpoint("no eligible endpoint serves this model")
        ids = [e.id for e in endpoints]
        precise = self._deps.precise_endpoints()  # one view for the whole request
        hashes = routing.block_hashes
        if self._deps.lookups_wait_on_io:  # Redis round trips: in parallel
            matches, shared = await asyncio.gather(self._lookup(hashes, ids, precise), self._shared_read(ids))
        else:
            matches, shared = await self._lookup(hashes, ids, precise), await self._shared_read(ids)
        timer.mark("lookup")

        self._observe_ttft(states[e.id] for e in endpoints)
        candidates: list[Candidate] = []  # the last decision's, for the calibration

        # where chains' next calls are due (read only while chains are measured: nothing else prices them)
        due = self._due.due_s(hashes, self._clock()) if routing.chain_followers > 0 else {}

        def decide(view: SharedQueues | None) -> Decided:
            queued = view.tokens if view is not None else {}
            busy = view.busy_s if view is not None and self._settings.share_busy else {}
            candidates[:] = [
                self._candidate(
                    states[e.id],
                    hashes,
                    matches.get(e.id, 0),
                    queued.get(e.id, 0.0),
                    e.id in precise,
                    due.get(e.id, ()),
                    busy.get(e.id, 0.0),
                )
                for e in endpoints
            ]
            return pd.decide(self._deps.profile, self._deps.pd, routing, candidates, self._rng)

        reserver = self._reserver if shared is not None else None
        if reserver is None or not await self._enter_step():
            decided = decide(shared)
            timer.mark("score")
            await self._commit(routing, decided, candidates, precise, shared_reserved=False)
            return decided
        assert shared is not None  # a reserver is used only with a shared view
        try:
            shared = fresher(shared, self._known)
            decided = decide(shared)
            timer.mark("score")
            first_token = _first_token_in_s if self._settings.share_busy else None
            settled = await reserver.settle(shared, decided, decide, _uncached(routing), ids, first_token)
            if settled.queues is not None:
                self._known = settled.queues
            self._deps.metrics.reservations.labels(settled.outcome).inc()
            timer.mark("reserve")
            await self._commit(routing, settled.decided, candidates, precise, shared_reserved=True)
            return settled.decided
        finally:
            self._serial.release()

    async def _enter_step(self) -> bool:
        """Take this replica's decide-reserve-record step, bounded: a slow Redis holding it up must not stall
        the requests queued behind it. False (counted ``busy``) past the lookup deadline."""
        try:
            async with asyncio.timeout(self._settings.lookup_deadline_s):
                await self._serial.acquire()
        except TimeoutError:
            self._deps.metrics.reservations.labels("busy").inc()
            return False
        return True

    async def _commit(
        self,
        routing: RoutingRequest,
        decided: Decided,
        candidates: Sequence[Candidate],
        precise: frozenset[EndpointId],
        *,
        shared_reserved: bool,
    ) -> None:
        """Record the decision (and a disaggregated request's prefill leg); tell the calibration what it predicted."""
        decision, split = decided
        self._predicted(routing, candidates, decision)
        prefill = split.prefill if split is not None else None
        await self._record(
            routing, decision, precise, prefilled_elsewhere=prefill is not None, shared_reserved=shared_reserved
        )
        if prefill is not None:
            await self._record_prefill(routing, prefill)

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
        precise_match = self._match(
            "precise", self._deps.precise, hashes, [e for e in endpoints if e in precise], deadline_s
        )
        approx_match = self._match("approx", self._deps.approx, hashes, endpoints, 2 * deadline_s)
        if self._deps.lookups_wait_on_io:
            exact, approx = await asyncio.gather(precise_match, approx_match)
        else:  # in memory, neither waits: one after the other saves the tasks a gather creates per request
            exact, approx = await precise_match, await approx_match
        return {e: max(exact.get(e, 0), approx.get(e, 0)) for e in endpoints}

    async def _match(
        self,
        name: str,
        index: GuessIndex,
        hashes: Sequence[BlockHash],
        endpoints: Collection[EndpointId],
        deadline_s: float,
    ) -> Mapping[EndpointId, int]:
        """``index``'s leading matches within ``deadline_s``; a miss is counted (label ``name``) as no match."""
        if not endpoints:
            return {}
        try:
            if self._deps.lookups_wait_on_io:  # a Redis call is left to finish, not cancelled (tasks.py says why)
                return await within_or_orphan(index.match(hashes, endpoints), deadline_s, self._background)
            async with asyncio.timeout(deadline_s):
                return await index.match(hashes, endpoints)
        except (TimeoutError, IndexUnavailable) as exc:
            self._deps.metrics.index_failures.labels(name).inc()
            self._lookup_missed(name, exc)
            return {}

    async def _shared_read(self, endpoints: Sequence[EndpointId]) -> SharedQueues | None:
        """Every replica's in-flight prefill per endpoint, with versions (shared load), or None when unshared or
        unavailable. A call past the deadline is left to finish (``tasks.within_or_orphan``)."""
        if self._deps.shared_load is None:
            return None
        try:
            read = self._deps.shared_load.read(endpoints)
            return await within_or_orphan(read, self._settings.lookup_deadline_s, self._background)
        except (TimeoutError, SharedLoadUnavailable) as exc:
            self._deps.metrics.index_failures.labels("shared_load").inc()
            self._lookup_missed("shared_load", exc)
            return None

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
        self,
        record: EndpointRecord,
        hashes: Sequence[BlockHash],
        cached_blocks: int,
        shared_queued: float = 0.0,
        precise: bool = False,
        calls_due_s: tuple[float, ...] = (),
        shared_busy_s: float = 0.0,
    ) -> Candidate:
        eid = record.endpoint.id
        now, stale_after_s = self._clock(), self._settings.stale_after_s
        load = snapshot(record, self._deps.inflight, shared_queued, now, stale_after_s, calls_due_s, shared_busy_s)
        occupancy = self._deps.occupancy
        shares = occupancy.view(eid) if occupancy is not None else None
        hot, hits, gap_s = None, 0, None
        if self._deps.hot_blocks is not None:
            hot = self._deps.hot_blocks.hot(eid)
            if 0 < cached_blocks <= len(hashes):
                hits = self._deps.hot_blocks.hits(eid, hashes[cached_blocks - 1])
                gap_s = self._deps.hot_blocks.hit_gap_s(eid, hashes[cached_blocks - 1])
        cost = self._deps.calibration.cost(eid) if self._deps.calibration is not None else None
        return Candidate(
            record.endpoint, load, cached_blocks, precise=precise, shares=shares, hot_blocks=hot, cost=cost,
            prefix_hits=hits, prefix_hit_gap_s=gap_s,
        )  # fmt: skip

    def _observe_ttft(self, records: Iterable[EndpointRecord]) -> None:
        """Every candidate's latest scraped TTFT totals reach the calibration before any cost is read, so one
        decision prices every candidate with the same learned state (observed one by one between the reads, an
        interval closing mid-decision priced the endpoints before it by the old model, the rest by the new)."""
        calibration = self._deps.calibration
        if calibration is None:
            return
        for record in records:
            if record.metrics is not None:
                calibration.observe(record.endpoint.id, record.metrics.ttft)

    def _predicted(self, routing: RoutingRequest, candidates: Sequence[Candidate], decision: Decision) -> None:
        """The pick's predicted TTFT and the estimate's terms behind it, for the calibration to check and learn."""
        pick = decision.endpoints[0]
        calibration, params = self._deps.calibration, self._deps.estimator
        if calibration is None or pick not in decision.estimates_s:
            return
        if params is None:
            calibration.predicted(pick, decision.estimates_s[pick])
            return
        chosen = next(c for c in candidates if c.endpoint.id == pick)
        terms = cost_terms(chosen, routing.prompt_tokens, routing.block_size, params, floor_share(routing))
        unlearned_s = terms.unlearned_s(chosen.cost or configured_cost(params))
        calibration.predicted(pick, decision.estimates_s[pick], terms.features(), unlearned_s)

    async def _record(
        self,
        routing: RoutingRequest,
        decision: Decision,
        precise: frozenset[EndpointId],
        *,
        prefilled_elsewhere: bool = False,
        shared_reserved: bool = False,
    ) -> None:
        """What we just routed becomes load and (approximate) cache state on the pick, before the next request.
        ``prefilled_elsewhere``: disaggregated, so the pick receives the KV instead of prefilling it.
        ``shared_reserved``: the reservation step already put it in the shared load; otherwise (the read failed)
        it is added there in the background, best effort.

        In memory the approximate record is written inline: the lookups no longer yield to the event loop, so a
        write left to a background task could miss the very next decision (a burst of one document would not
        see its own first pick). With Redis the write waits on I/O and stays in the background."""
        pick = decision.endpoints[0]
        now = self._clock()
        extended = self._extended(routing, decision)
        since_s = None if extended is None else self._prompt_ends.since_s(extended, now)
        continued = since_s is not None or self._continued(routing, decision)
        self._reuse.decided(decision.reason, continued=continued, at_s=now, gap_s=since_s)
        # measured whether or not this replica routed the call it extends: another replica's is heard (``heard``)
        after_s = None if extended is None else self._due.continued(extended, len(routing.block_hashes), now)
        self._prompt_ends.routed(routing.block_hashes, now)
        self._deps.metrics.placement_followers.set(self._reuse.followers())
        self._deps.metrics.chain_followers.set(self._reuse.chain_followers(now))
        uncached = 0 if prefilled_elsewhere else max(routing.prompt_tokens - decision.cached_tokens, 0)
        first_token_in_s = None if prefilled_elsewhere else decision.estimates_s.get(pick)  # busy prefilling it
        self._deps.inflight.add(pick, uncached, first_token_in_s)
        if first_token_in_s is not None:
            self._due.routed(pick, routing.block_hashes, now, first_token_in_s, after_s)
            self._tell_due(pick, routing, first_token_in_s, after_s, extended)
        if self._deps.hot_blocks is not None:
            placed = decision.reason == Reason.LOAD
            self._deps.hot_blocks.routed(
                pick, routing.block_hashes, decision.cached_tokens // routing.block_size, placed=placed
            )
        if self._deps.shared_load is not None and not shared_reserved:
            busy_s = (first_token_in_s or 0.0) if self._settings.share_busy else 0.0
            self._spawn(self._deps.shared_load.add(pick, uncached, busy_s))
        if self._deps.occupancy is not None:
            cached_blocks = decision.cached_tokens // routing.block_size
            self._deps.occupancy.routed(pick, routing.tenant.cls, routing.block_hashes, cached_blocks, uncached)
        if routing.block_hashes:
            # Where events will report the blocks (a cold event-fed endpoint included), our record only bridges
            # the moment until they do: a short burst mark, never a 600 s guess that its BlockRemoved cannot undo.
            live = self._deps.has_live_events(pick) if self._deps.has_live_events else pick in precise
            ttl = self._settings.burst_mark_ttl_s if live else self._settings.approx_ttl_s
            await self._write(self._deps.approx.store(pick, routing.block_hashes, ttl_s=ttl, chain=_FROM_ROOT))

    def _tell_due(
        self,
        pick: EndpointId,
        routing: RoutingRequest,
        first_token_in_s: float,
        after_s: float | None,
        extended: BlockHash | None,
    ) -> None:
        """Tell the other replicas (``on_due_call``) the call just routed, as ``_due`` remembers it; only while
        chains are measured here (``chain_followers``): with none, no replica prices a due call (``collision_s``),
        and traffic without chains (documents, tenants) pays nothing per request for it."""
        tell, hashes = self._deps.on_due_call, routing.block_hashes
        if tell is not None and hashes and routing.chain_followers > 0:
            tell(DueCall(pick, hashes[-1], len(hashes), first_token_in_s, after_s, extended))

    def heard_due_call(self, call: DueCall) -> None:
        """Another replica routed ``call`` (``redis.touches``): its chain's next call is due here too."""
        self._due.heard(call, self._clock())

    def _extended(self, routing: RoutingRequest, decision: Decision) -> BlockHash | None:
        """For a warm decision, the last block of its cached prefix: where it extends a recent request's whole
        prompt if one ended there (``PromptEnds``; a chain's next call, even after a first call that was placed
        cold); ``None`` for a cold one or none cached."""
        cached_blocks = decision.cached_tokens // routing.block_size
        if decision.reason == Reason.LOAD or not 0 < cached_blocks <= len(routing.block_hashes):
            return None
        return routing.block_hashes[cached_blocks - 1]

    def _continued(self, routing: RoutingRequest, decision: Decision) -> bool:
        """Whether the pick's cached prefix ends in blocks that one earlier request stored there and nobody hit
        since (not in the hot set: neither hit nor placed as a new prefix): this request continues that request's
        own context (``scheduling.prefix_reuse``). A question about a document placed there ends in the placed
        prefix: it starts something. Read before the record counts its hit."""
        cached_blocks = decision.cached_tokens // routing.block_size
        if self._deps.hot_blocks is None or not 0 < cached_blocks <= len(routing.block_hashes):
            return False
        return not self._deps.hot_blocks.tracked(decision.endpoints[0], routing.block_hashes[cached_blocks - 1])

    async def _record_prefill(self, routing: RoutingRequest, prefill: EndpointId) -> None:
        """A disaggregated request's prefill leg is load on the prefill endpoint, which keeps its blocks (the
        decode endpoint's share is recorded by ``_record``: it stores the transferred blocks)."""
        self._deps.inflight.add(prefill, routing.prompt_tokens)
        if routing.block_hashes:
            ttl = self._settings.burst_mark_ttl_s
            await self._write(self._deps.approx.store(prefill, routing.block_hashes, ttl_s=ttl, chain=_FROM_ROOT))

    async def _write(self, write: Coroutine[Any, Any, None]) -> None:
        """An approximate-index write: inline in memory (the next decision must see it), in the background
        with Redis (it waits on I/O)."""
        if self._deps.lookups_wait_on_io:
            self._spawn(write)
        else:
            await write

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

    def _ttft_ratio(self, endpoint: EndpointId) -> float:
        """The pick's measured actual / predicted TTFT so far (1.0 until calibration has measured it)."""
        return self._deps.calibration.ratio(endpoint) if self._deps.calibration else 1.0


def _first_token_in_s(decided: Decided) -> float:
    """Seconds to the pick's predicted first token, which keeps it busy prefilling (0: not estimated, or
    disaggregated: the pick receives the KV instead of prefilling it), as ``_record`` tells ``InflightLoad``."""
    decision, split = decided
    if split is not None and split.prefill is not None:
        return 0.0
    return decision.estimates_s.get(decision.endpoints[0], 0.0)


def _uncached(routing: RoutingRequest) -> Callable[[Decided], int]:
    """The prefill a decision puts on its pick: the uncached prompt, none if disaggregated (prefilled elsewhere)."""

    def tokens(decided: Decided) -> int:
        decision, split = decided
        if split is not None and split.prefill is not None:
            return 0
        return max(routing.prompt_tokens - decision.cached_tokens, 0)

    return tokens
