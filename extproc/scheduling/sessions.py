"""Leaving a warm endpoint as an investment: the copy of a prefix is paid once and spread over its reuse.

A per-request estimate never pays for copying a prefix: the request that copies it waits for the whole prefill,
while every later request sharing that prefix gains. Agent sessions show the cost: each session's first call
finds the shared tool definitions on one endpoint, stays there, and all sessions pile on it (their decode
batches slow every step there) while other endpoints idle.

Here a target that lacks part of the warm endpoint's prefix is priced as if it held it, plus its copy spread
over the reuse of what is copied. The reuse is measured, not guessed: one plus the requests that hit the warm
endpoint's deepest matched block lately (``Candidate.prefix_hits``). A shared prefix (tool definitions, a system
prompt many sessions extend) has many hits, so its copy is cheap per use; a session's own context has had none
beyond its own calls, so moving it costs this request the whole copy. A fresh copy of a shared prefix has no
hits yet either: where requests continue chains, its reuse is read on the holder it was hit on (``_reused_on``),
or a chain's start follows the copy onto its endpoint while the copy still prefills, and the two chains collide
on every call (agents at 6 req/s, ``bench/results/chain-starts``); one-off traffic reads the warm endpoint's own
hits, or documents are copied again from their second holder (3 copies a cell instead of 1). Only the uses that
would meet the queue count (``lasting_hits``): a burst of one-off requests drains before a prefix used every two
seconds is used again (measured: tenants at 8 req/s, ``bench/results/tenants8-moves``), while chains keep their
load.

Hysteresis: the copy is counted twice, once for going and once for the way back, so a move must save more than
a round trip would cost. Moving back for a session means copying its context again (hits: its own), which a
momentary queue elsewhere does not repay; so it does not ping-pong. Only the targets a move may take at all
(``TtftProfile._move_costs``: idle with room for the copy, or copying nothing) are priced. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from extproc.scheduling.estimate import EstimatorParams, estimate_ttft_s
from extproc.types import Candidate, EndpointId, RoutingRequest


def invested_estimates(
    request: RoutingRequest,
    warm: Candidate,
    targets: Iterable[Candidate],
    est: Mapping[EndpointId, float],
    params: EstimatorParams,
    lasting_s: float,
    holders: Sequence[Candidate] = (),
    due: Mapping[EndpointId, float] | None = None,
) -> dict[EndpointId, float]:
    """Per target other than ``warm`` that would copy part of its prefix: the target's estimate as if it held
    that prefix, plus twice its copy spread over the prefix's reuse (module docstring). ``est``: the plain
    estimates (with the request's ``floor_share``, as the as-if one), whose difference from the as-if one is the
    copy; ``lasting_s``: the warm endpoint's estimate against load that lasts, the queue a move avoids;
    ``holders``: the candidates that hold as much of the prompt as ``warm`` (``_reused_on``); ``due``: what
    going to each target costs the calls due there (``due_calls.collision_s``), added as it is to
    ``lasting_s``."""
    used = _reused_on(request, warm, holders)
    reuse = 1.0 + lasting_hits(request, used, lasting_s)
    if used.prefix_hits > 0:  # a shared prefix: each use starts a chain, which brings its measured calls along
        reuse *= 1 + request.chain_followers
    share = floor_share(request)
    out: dict[EndpointId, float] = {}
    for c in targets:
        if c.endpoint.id == warm.endpoint.id or c.cached_blocks >= warm.cached_blocks:
            continue
        held = replace(c, cached_blocks=warm.cached_blocks)
        as_if = estimate_ttft_s(held, request.prompt_tokens, request.block_size, params, share)
        copy_s = max(est[c.endpoint.id] - as_if, 0.0)
        out[c.endpoint.id] = as_if + 2 * copy_s / reuse + (due or {}).get(c.endpoint.id, 0.0)
    return out


def _reused_on(request: RoutingRequest, warm: Candidate, holders: Sequence[Candidate]) -> Candidate:
    """Where the prefix's reuse is read: the warm endpoint, or, as far as requests continue chains lately
    (``floor_share``), the holder of as much of it that was hit most, with that holder's gap between hits (a
    chain's start on a fresh copy of shared tools: the copy has no hits yet, but the chains that hit the tools
    elsewhere start wherever the tools are)."""
    most = max(holders, key=lambda c: c.prefix_hits, default=warm)
    share = floor_share(request)
    if most.prefix_hits <= warm.prefix_hits or share <= 0:
        return warm
    hits = warm.prefix_hits + round(share * (most.prefix_hits - warm.prefix_hits))
    return replace(warm, prefix_hits=hits, prefix_hit_gap_s=most.prefix_hit_gap_s)


def lasting_hits(request: RoutingRequest, warm: Candidate, lasting_s: float) -> float:
    """The prefix's recent hits that would have met the warm endpoint's queue too: what a copy is spread over.

    Load made of chains lasts: each call brings the chain's next one, so the queue a chain start avoids is met by
    every later use of the prefix, and all its hits count. Load made of one-off requests is a burst that drains
    within about ``lasting_s`` (the queue ahead of this request is served before its first token): only the uses
    arriving meanwhile (``lasting_s`` over the prefix's mean gap between hits) would meet it; one that comes
    after the burst finds the warm endpoint idle and gains nothing from a copy elsewhere. Between the two, as far
    as requests continue chains lately (``floor_share``). Until the decisions say so, load reads as lasting (as
    every hit counted before): the one-off share grows as their window fills (``chains_measured``), because a
    chain's first calls come before any chain was measured (agents, counted as one-off from the first
    decision: TTFT p90 medians +18-19% over four runs, ``bench/results/burst-moves``). Unmeasured gaps count
    every hit."""
    hits = float(max(warm.prefix_hits, 0))
    gap_s = warm.prefix_hit_gap_s
    if gap_s is None or hits == 0:
        return hits
    chained = 1 - (1 - floor_share(request)) * min(max(request.chains_measured, 0.0), 1.0)
    met = min(hits, lasting_s / gap_s) if gap_s > 0 else hits
    return chained * hits + (1 - chained) * met


def floor_share(request: RoutingRequest) -> float:
    """How much of the busy floor counts for ``request`` (``estimate``): a prefill of ours beside it delays a
    one-off request once, but beside a chain's calls the wait comes back on every call of both chains (lockstep,
    docs/scheduling.md), so it counts as far as requests continue chains lately, in full from one call per
    chain's start."""
    return min(request.chain_followers, 1.0)
