"""Scheduling profiles: turn frozen candidates into a ``Decision``.

``TtftProfile`` (the default) estimates each candidate's time to first token and picks the lowest, spreading
near-ties; it stays with the warmest endpoint while that costs at most ``stickiness_s`` more (or, for a tenant
with a TTFT target, while the warm estimate meets the target), because keeping a prefix where it is cached saves
prefill work for the requests that follow; it leaves earlier (reason ``move``) for an idle endpoint where copying
the prefix, spread over the prefix's measured reuse, costs less than the warm endpoint's queue
(``scheduling/sessions.py``). A match below ``min_prefix_share`` of the prompt (a shared system
prompt, say) does not make an endpoint warm: such a request is routed by load. Every choice ranks a candidate by
its estimate plus what going there costs chains' calls due there (``scheduling/due_calls.py``; 0 without
chains); the estimate alone is the request's predicted TTFT. ``WeightedProfile`` is the
classic weighted-scorer blend.

The profiles have no defaults of their own: ``scheduling.build.build_profile`` fills them from the validated
config, the one home of every default.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from extproc.errors import NoEndpoint, Overloaded
from extproc.scheduling.due_calls import collision_s
from extproc.scheduling.estimate import EstimatorParams, cached_tokens, copy_fits, estimate_ttft_s, imposed_s
from extproc.scheduling.scorers import SCORERS
from extproc.scheduling.sessions import floor_share, invested_estimates
from extproc.scheduling.tenant_shares import SharePolicy, narrowed
from extproc.types import Candidate, Decision, EndpointId, Reason, RoutingRequest


class Profile(Protocol):
    def decide(self, request: RoutingRequest, candidates: Sequence[Candidate], rng: random.Random) -> Decision:
        """Pick among ``candidates`` (already filtered). Raises NoEndpoint (none) or Overloaded (shed)."""
        ...


@dataclass(frozen=True, slots=True)
class TtftProfile:
    params: EstimatorParams
    stickiness_s: float
    min_prefix_share: float
    tie_epsilon_s: float
    fallbacks: int
    shed_ttft_s: float
    shares: SharePolicy  # tenant cache shares (inactive unless a class is protected: tenant_shares.py)
    copy_into_full_kv: bool

    def decide(self, request: RoutingRequest, candidates: Sequence[Candidate], rng: random.Random) -> Decision:
        _require(candidates)
        allowed = narrowed(request, candidates, self.shares)
        if allowed is not candidates:  # kept off another class's protected blocks: say so, whatever the pick
            decision = self._decide(request, allowed, rng)
            return replace(decision, reason=Reason.SHARE)
        return self._decide(request, candidates, rng)

    def _decide(self, request: RoutingRequest, candidates: Sequence[Candidate], rng: random.Random) -> Decision:
        share = floor_share(request)
        est = {
            c.endpoint.id: estimate_ttft_s(c, request.prompt_tokens, request.block_size, self.params, share)
            for c in candidates
        }
        # Ranked by the estimate plus what going there costs the chains' calls due there (0 without chains);
        # the estimate alone is this request's predicted TTFT (reported, learned from, and its TTFT target's).
        due = {c.endpoint.id: collision_s(request, c, est[c.endpoint.id]) for c in candidates}
        rank = {e: est[e] + due[e] for e in est}
        pick, reason = self._pick(request, candidates, _Priced(est, due, rank), rng)
        # Judged on the pick, not the best: a request held on its busy warm endpoint is the one that waits.
        if request.tenant.priority < 0 and est[pick] > self.shed_ttft_s:
            raise Overloaded(f"all endpoints busy (estimated TTFT {est[pick]:.1f}s); sheddable request refused")
        due_s = {e: v for e, v in due.items() if v > 0}
        return _decision(request, candidates, pick, reason, rank, self.fallbacks, estimates_s=est, due_s=due_s)

    def _pick(
        self, request: RoutingRequest, candidates: Sequence[Candidate], priced: _Priced, rng: random.Random
    ) -> tuple[EndpointId, Reason]:
        rank = priced.rank  # what the choice compares (``_decide``)
        best = min(rank.values())
        if request.prompt_tokens == 0:
            return _spread(rank, best, self.tie_epsilon_s, rng), Reason.NO_TOKENS
        warm = max(candidates, key=lambda c: (c.cached_blocks, -rank[c.endpoint.id]))
        share = cached_tokens(warm, request.prompt_tokens, request.block_size) / request.prompt_tokens
        if share < self.min_prefix_share:  # e.g. only a shared system prompt: cold, a new prefix to place
            return self._place(request, candidates, rank, best, rng), Reason.LOAD
        warm_rank = rank[warm.endpoint.id]
        target = request.tenant.ttft_target_s
        if target is not None and priced.estimate[warm.endpoint.id] <= target:
            return warm.endpoint.id, Reason.CACHE
        move = self._move_costs(request, candidates, warm, rank)
        if warm_rank <= best + self.stickiness_s:  # worth staying by the request's own rank; the prefix's?
            allowed = [c for c in candidates if c.endpoint.id in move]
            lasting_s = self._lasting_s(request, warm) + priced.due[warm.endpoint.id]
            holders = [c for c in candidates if c.cached_blocks == warm.cached_blocks]
            invested = invested_estimates(
                request, warm, allowed, priced.estimate, self.params, lasting_s, holders, due=priced.due
            )
            if invested and min(invested.values()) < lasting_s - self.tie_epsilon_s:
                return _spread(invested, min(invested.values()), self.tie_epsilon_s, rng), Reason.MOVE
            return warm.endpoint.id, Reason.CACHE
        best_move = min(move.values())  # the warm endpoint is always a "move" at its own estimate
        if warm_rank <= best_move + self.stickiness_s:
            return warm.endpoint.id, Reason.HOLD if warm_rank > best + self.stickiness_s else Reason.CACHE
        return _spread(move, best_move, self.tie_epsilon_s, rng), Reason.SPILL

    def _lasting_s(self, request: RoutingRequest, warm: Candidate) -> float:
        """The warm endpoint's estimate against load that lasts, which a copy must beat: not the requests routed
        since the last scrape (a bridge until the scrape shows them; many are done). A prefill of ours that is
        predicted to run yet stays, at the busy floor's share (``floor_share``)."""
        steady = replace(warm, load=replace(warm.load, queued_requests=0))
        return estimate_ttft_s(steady, request.prompt_tokens, request.block_size, self.params, floor_share(request))

    def _place(
        self,
        request: RoutingRequest,
        candidates: Sequence[Candidate],
        est: Mapping[EndpointId, float],
        best: float,
        rng: random.Random,
    ) -> EndpointId:
        """Where a cold prompt goes: its prefix will attract the requests that share it, so among the endpoints
        within ``stickiness_s`` of the best estimate, the one whose cache serves the least hot traffic (fewest
        hot blocks); a momentary queue must not decide where a prefix lives (unbalanced placements overload one
        endpoint for good once requests hold on their warm endpoints). That is worth giving up estimate only as
        far as requests follow new prefixes: the window is ``stickiness_s`` times the followers measured per
        placement lately (``RoutingRequest.prefix_followers``, at most one); on traffic that shares nothing it
        closes, and placement is by estimate. And it never spans more than the work being placed (the prompt's
        prefill at the configured rate): endpoints whose estimates differ by less than one placement are even up
        to how placements divide, and the hot traffic decides; a larger difference is load of its own, a queue
        that lasts (a saturated endpoint's cold placements read as few hot blocks and kept drawing more), and
        the estimate decides. Among the endpoints serving the least hot traffic, what the placement costs the
        requests waiting there counts beside its own estimate (``estimate.imposed_s``). Untracked hot sets: by
        estimate alone."""
        followed_s = self.stickiness_s * min(request.prefix_followers, 1.0)
        window_s = min(followed_s, request.prompt_tokens / self.params.prefill_tokens_per_s)
        near = [c for c in candidates if est[c.endpoint.id] <= best + window_s]
        if any(c.hot_blocks is None for c in near):
            return _spread(est, best, self.tie_epsilon_s, rng)
        least = min(c.hot_blocks or 0 for c in near)
        # Among those, its own estimate and the delay its prefill adds to the requests waiting there: a momentary
        # queue, so it chooses only here (ranking every candidate by it made placements lean, docs/scheduling.md)
        coldest = {
            c.endpoint.id: est[c.endpoint.id] + imposed_s(c, request.prompt_tokens, request.block_size, self.params)
            for c in near
            if c.hot_blocks == least
        }
        return _spread(coldest, min(coldest.values()), self.tie_epsilon_s, rng)

    def _move_costs(
        self, request: RoutingRequest, candidates: Sequence[Candidate], warm: Candidate, est: Mapping[EndpointId, float]
    ) -> dict[EndpointId, float]:
        """The estimates of the endpoints a request may leave its warm endpoint for (``docs/scheduling.md``).

        A move copies the prefix, so it must not feed the spill cascade: the target needs room for the copy
        (a copy that evicts another hot prefix makes that prefix's next request cold, and so on) and idle
        capacity for its prefill (on a busy target the copy's extra prefill is a backlog every later request
        there waits behind, and at saturation it never drains). An endpoint that holds as much of the prompt
        as the warm one copies nothing and is always a move.
        """
        prompt, bs = request.prompt_tokens, request.block_size
        out: dict[EndpointId, float] = {}
        for c in candidates:
            copies_nothing = c.cached_blocks >= warm.cached_blocks
            idle = c.load.waiting == 0 and c.load.queued_prefill_tokens == 0
            if copies_nothing or self.copy_into_full_kv or (idle and copy_fits(c, prompt, bs)):
                out[c.endpoint.id] = est[c.endpoint.id]
        return out


@dataclass(frozen=True, slots=True)
class _Priced:
    """One decision's prices per candidate: this request's TTFT estimate, what going there costs the calls due
    there (``due_calls.collision_s``), and their sum, which the choice compares."""

    estimate: Mapping[EndpointId, float]
    due: Mapping[EndpointId, float]
    rank: Mapping[EndpointId, float]


@dataclass(frozen=True, slots=True)
class WeightedProfile:
    """Score each candidate with weighted scorers in [0, 1] (higher is better) and take the maximum."""

    weights: Mapping[str, float]  # scorer name (a key of ``SCORERS``) → weight
    fallbacks: int

    def decide(self, request: RoutingRequest, candidates: Sequence[Candidate], rng: random.Random) -> Decision:
        _require(candidates)
        total: dict[EndpointId, float] = {c.endpoint.id: 0.0 for c in candidates}
        for name, weight in self.weights.items():
            scores = SCORERS[name](request, candidates)
            for c in candidates:
                total[c.endpoint.id] += weight * min(max(scores.get(c.endpoint.id, 0.0), 0.0), 1.0)
        neg = {e: -v for e, v in total.items()}  # lower-is-better for the shared helpers
        pick = _spread(neg, min(neg.values()), 1e-9, rng)
        chosen = next(c for c in candidates if c.endpoint.id == pick)
        reason = Reason.CACHE if chosen.cached_blocks else Reason.LOAD
        if request.prompt_tokens == 0:
            reason = Reason.NO_TOKENS
        return _decision(request, candidates, pick, reason, neg, self.fallbacks, scores=total)


def _require(candidates: Sequence[Candidate]) -> None:
    """Both profiles' prologue. The router checks first; this guards direct callers (the Profile contract)."""
    if not candidates:
        raise NoEndpoint("no eligible endpoint serves this model")


def _decision(
    request: RoutingRequest,
    candidates: Sequence[Candidate],
    pick: EndpointId,
    reason: Reason,
    order: Mapping[EndpointId, float],
    fallbacks: int,
    *,
    estimates_s: Mapping[EndpointId, float] | None = None,
    scores: Mapping[EndpointId, float] | None = None,
    due_s: Mapping[EndpointId, float] | None = None,
) -> Decision:
    """Both profiles' epilogue: the pick, ``fallbacks`` more by ``order`` (lower first), the pick's cached
    tokens, and the numbers behind the decision under the name of what they mean."""
    chosen = next(c for c in candidates if c.endpoint.id == pick)
    return Decision(
        endpoints=(pick, *_fallbacks(order, pick, fallbacks)),
        reason=reason,
        cached_tokens=cached_tokens(chosen, request.prompt_tokens, request.block_size),
        estimates_s=estimates_s or {},
        scores=scores or {},
        due_s=due_s or {},
    )


def _spread(est: Mapping[EndpointId, float], best: float, epsilon: float, rng: random.Random) -> EndpointId:
    """One of the endpoints whose estimate is within ``epsilon`` of the best, at random (ties spread)."""
    ties = sorted(e for e, v in est.items() if v <= best + epsilon)
    return ties[0] if len(ties) == 1 else rng.choice(ties)


def _fallbacks(order: Mapping[EndpointId, float], pick: EndpointId, n: int) -> tuple[EndpointId, ...]:
    """The next ``n`` endpoints by ``order`` (lower first), for Envoy's retries."""
    rest = sorted((v, e) for e, v in order.items() if e != pick)
    return tuple(e for _, e in rest[:n])
