"""Tenant cache shares by placement: keep a class that must evict off another class's protected blocks.

vLLM evicts least-recently-used blocks whoever put them there; the router cannot choose what an engine evicts,
only where a prefill lands. So the rule narrows the candidates of a request that would evict:

* A request's class is **exempt** on an endpoint when it is under its ``cache_share`` there (of the fleet: its
  blocks fleet-wide plus this prefill within ``cache_share`` of every candidate's capacity; of each endpoint:
  within ``cache_share`` of that endpoint's): a tenant under its share is never penalised.
* An endpoint is **harmless** for a request when it holds no other class's protected blocks, or when its
  prefill fits in the blocks left free there after the *room* the protected classes there may still fill
  within their shares (no eviction now, and none of theirs later). Protected blocks: those of a
  ``protect_hot_prefixes`` class, confirmed or routed and not yet confirmed (``EndpointShares.held``), up to
  that class's own share (beyond it, its excess is fair game). Free blocks alone are not enough: a filling
  cache has room for a flood's first prompts, whose prefills then queue ahead of the protected class's next
  cold prompts and whose blocks later push its prefixes out (``docs/tenants.md``, "Why premium was slower").
* An endpoint that would evict protected blocks is still allowed within the class's
  ``uncached_tokens_per_endpoint`` (its uncached tokens in flight there, this request's included). That bounds
  the class's queue there, not its eviction churn: the queue drains at the prefill rate, so a flood within
  the budget still cycles the engine's LRU (``bench/results/noisy-neighbour-budget``: premium's cached share
  fell to 0.21 with a one-prompt budget). Leave it unset to keep a flood off protected prefixes.
* When nothing is allowed: a sheddable class (priority < 0) is refused (``Overloaded``, 429); any other goes to
  the endpoints holding the fewest protected blocks (least harm), never refused.
* A protected class's own requests go *home*: to the endpoints where the class already holds blocks, when
  the prompt is warm there or has room within the class's share (``homes``). Its hot prefixes gather on few
  endpoints and stay where they are warm, so the rest of the fleet stays open to everyone else. A *cold*
  prompt whose every home is busy (at least half its own prefill queued there) may also open a new
  home on an idle endpoint (nothing running, waiting or routed there): spare capacity only, so a class alone
  does not queue its cold starts behind each other, and under a flood (no endpoint idle) it stays home.

Pure: frozen candidates (``Candidate.shares``, filled by ``kvcache.occupancy``) and the policy; no clocks, no I/O.
A candidate whose capacity or shares are unknown is left alone. With no protected class nothing is ever narrowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extproc.errors import Overloaded
from extproc.types import Candidate, EndpointShares, RoutingRequest


@dataclass(frozen=True, slots=True)
class ClassShare:
    """One class's cache policy, as ``config.TenantClass`` sets it (``build.py`` fills it)."""

    cache_share: float | None
    per_endpoint: bool  # cache_share is of each endpoint's blocks (else of the fleet's)
    protected: bool


@dataclass(frozen=True, slots=True)
class SharePolicy:
    """Every class's cache policy (``{class name: ClassShare}``; unlisted classes: ``default``)."""

    classes: Mapping[str, ClassShare]
    default: ClassShare

    @property
    def active(self) -> bool:
        """Whether the rule can ever narrow a decision: only when some class is protected."""
        return self.default.protected or any(c.protected for c in self.classes.values())

    def of(self, cls: str) -> ClassShare:
        return self.classes.get(cls, self.default)


def restrict(request: RoutingRequest, candidates: Sequence[Candidate], policy: SharePolicy) -> Sequence[Candidate]:
    """The candidates ``request`` may go to under ``policy`` (``candidates`` itself when nothing is narrowed).

    Raises ``Overloaded`` when a sheddable request could only evict another class's protected blocks."""
    if not policy.active or request.prompt_tokens <= 0:
        return candidates
    need = -(-request.prompt_tokens // request.block_size)  # blocks this prompt fills (ceil)
    mine = request.tenant.cls
    guarded = _guarded(candidates, policy, mine)
    allowed = [c for c in candidates if _allowed(request, c, need, guarded.get(c.endpoint.id, _NONE), policy)]
    if len(allowed) == len(candidates):
        return candidates
    if allowed:
        return allowed
    if request.tenant.priority < 0:
        raise Overloaded(f"tenant class {mine!r} would evict protected prefixes everywhere; sheddable, refused")
    least = min(guarded.get(c.endpoint.id, _NONE)[0] for c in candidates)
    return [c for c in candidates if guarded.get(c.endpoint.id, _NONE)[0] <= least]


_NONE = (0.0, 0.0)  # (protected blocks, reserved room) of an endpoint no other protected class holds


def _allowed(
    request: RoutingRequest, c: Candidate, need: int, guarded: tuple[float, float], policy: SharePolicy
) -> bool:
    shares, capacity = c.shares, c.endpoint.num_gpu_blocks
    protected, room = guarded
    if shares is None or capacity is None or protected <= 0:
        return True
    uncached_blocks = max(need - c.cached_blocks, 0)
    free = capacity - shares.used_blocks - sum(shares.pending_by_class.values()) - room
    if uncached_blocks <= free:  # fits beside the protected classes' room: evicts nobody's, now or later
        return True
    mine = request.tenant.cls
    own = policy.of(mine)
    held = shares.held(mine)
    if own.cache_share is not None and own.per_endpoint and held + uncached_blocks <= own.cache_share * capacity:
        return True  # under its share of this endpoint
    budget = request.tenant.uncached_tokens_per_endpoint
    if budget is None:
        return False
    uncached_tokens = uncached_blocks * request.block_size
    return shares.inflight_uncached.get(mine, 0.0) + uncached_tokens <= budget


def _guarded(candidates: Sequence[Candidate], policy: SharePolicy, mine: str) -> dict[str, tuple[float, float]]:
    """``{endpoint: (blocks of other protected classes there, the room they may still fill there)}`` (not
    ``mine``: a class may evict its own). Blocks are counted up to each class's share (of the endpoint, or
    scaled down where it is over its fleet share); its room there is what its share leaves (of the endpoint,
    or of the fleet less what it holds elsewhere), at most the endpoint's capacity."""
    fleet_capacity = sum(c.endpoint.num_gpu_blocks or 0 for c in candidates)
    fleet_by_class: dict[str, int] = {}
    for c in candidates:
        if c.shares is not None:
            for cls in _classes(c.shares):
                fleet_by_class[cls] = fleet_by_class.get(cls, 0) + c.shares.held(cls)
    out: dict[str, tuple[float, float]] = {}  # EndpointId → (blocks, blocks)
    for c in candidates:
        capacity = c.endpoint.num_gpu_blocks
        if c.shares is None or not capacity:
            continue
        kept = room = 0.0
        for cls in _classes(c.shares) - {mine}:
            n, share = c.shares.held(cls), policy.of(cls)
            kept += _kept(cls, n, capacity, fleet_by_class[cls], fleet_capacity, policy)
            if share.protected and share.cache_share is not None and n > 0:
                limit = share.cache_share * (capacity if share.per_endpoint else fleet_capacity)
                elsewhere = 0 if share.per_endpoint else fleet_by_class[cls] - n
                room += max(0.0, min(limit - elsewhere, capacity) - n)
        out[c.endpoint.id] = (kept, room)
    return out


def _classes(shares: EndpointShares) -> set[str]:
    return set(shares.by_class) | set(shares.pending_by_class)


def _kept(cls: str, blocks: int, capacity: int, fleet_blocks: int, fleet_capacity: int, policy: SharePolicy) -> float:
    """Of ``cls``'s ``blocks`` on one endpoint, how many are protected."""
    share = policy.of(cls)
    if not share.protected:
        return 0.0
    if share.cache_share is None:
        return float(blocks)
    if share.per_endpoint:
        return min(float(blocks), share.cache_share * capacity)
    cap = share.cache_share * fleet_capacity
    return float(blocks) if fleet_blocks <= cap else blocks * cap / fleet_blocks


def exempt(request: RoutingRequest, candidates: Sequence[Candidate], policy: SharePolicy) -> bool:
    """Whether ``request``'s class is under its fleet share with this prefill (then ``restrict`` is skipped)."""
    own = policy.of(request.tenant.cls)
    if own.cache_share is None or own.per_endpoint:
        return False
    capacity = sum(c.endpoint.num_gpu_blocks or 0 for c in candidates)
    held = sum(c.shares.held(request.tenant.cls) for c in candidates if c.shares)
    need = -(-request.prompt_tokens // request.block_size)
    return capacity > 0 and held + need <= own.cache_share * capacity


def homes(request: RoutingRequest, candidates: Sequence[Candidate], policy: SharePolicy) -> Sequence[Candidate]:
    """A protected class's prompt goes where its class already holds blocks and either the prompt is warm (it
    evicts, at most, its own class's older blocks there) or a cold prompt has room within the class's share
    (``candidates`` itself when none qualifies, or the class is not protected): its hot prefixes gather on few
    endpoints, so the others stay free for everyone else, and a warm prefix stays where it is warm. A cold
    prompt whose homes are all busy may also go to the idle endpoints where it harms nobody (``_spare``)."""
    mine = request.tenant.cls
    own = policy.of(mine)
    if not own.protected:
        return candidates
    need = -(-request.prompt_tokens // request.block_size)
    # the share of one endpoint it may fill: of each endpoint, or its fleet share as if spread evenly (at most all)
    fraction = 1.0 if own.cache_share is None else own.cache_share * (1 if own.per_endpoint else len(candidates))
    home = [
        c
        for c in candidates
        if c.shares is not None
        and c.endpoint.num_gpu_blocks
        and (held := c.shares.held(mine)) > 0
        and (c.cached_blocks > 0 or held + need <= min(fraction, 1.0) * c.endpoint.num_gpu_blocks)
    ]
    if not home or len(home) == len(candidates):
        return candidates
    return [*home, *_spare(request, candidates, home, policy)]


def _spare(
    request: RoutingRequest, candidates: Sequence[Candidate], home: Sequence[Candidate], policy: SharePolicy
) -> list[Candidate]:
    """Where a cold prompt of a protected class may open a new home: none while it is warm at a home or some
    home is not busy (queued there: under half its own prefill, nobody waiting); else the idle endpoints
    (nothing running, waiting or routed there) where it evicts no other class's protected blocks."""
    if any(c.cached_blocks > 0 for c in home):
        return []
    if not all(c.load.waiting > 0 or c.load.queued_prefill_tokens >= request.prompt_tokens / 2 for c in home):
        return []
    need = -(-request.prompt_tokens // request.block_size)
    guarded = _guarded(candidates, policy, request.tenant.cls)
    ids = {c.endpoint.id for c in home}
    return [
        c
        for c in candidates
        if c.endpoint.id not in ids
        and c.load.known
        and c.load.running == 0
        and c.load.waiting == 0
        and c.load.inflight_requests == 0
        and c.load.queued_prefill_tokens == 0
        and _allowed(request, c, need, guarded.get(c.endpoint.id, _NONE), policy)
    ]


def narrowed(request: RoutingRequest, candidates: Sequence[Candidate], policy: SharePolicy) -> Sequence[Candidate]:
    """The profile's one call: a protected class's requests go home (``homes``); any other class is narrowed
    by ``restrict`` unless it is under its fleet share."""
    if not policy.active or request.prompt_tokens <= 0:
        return candidates
    if policy.of(request.tenant.cls).protected:
        return homes(request, candidates, policy)
    if exempt(request, candidates, policy):
        return candidates
    return restrict(request, candidates, policy)
