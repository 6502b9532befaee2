"""Scorers for the weighted profile: each maps candidates to [0, 1], higher is better. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from extproc.types import Candidate, EndpointId, RoutingRequest

Scorer = Callable[[RoutingRequest, Sequence[Candidate]], Mapping[EndpointId, float]]


def prefix_score(request: RoutingRequest, candidates: Sequence[Candidate]) -> Mapping[EndpointId, float]:
    """Share of the request's blocks held by each candidate."""
    total = max(len(request.block_hashes), 1)
    return {c.endpoint.id: c.cached_blocks / total for c in candidates}


def queue_score(request: RoutingRequest, candidates: Sequence[Candidate]) -> Mapping[EndpointId, float]:
    """1 for the shortest queue, 0 for the longest (waiting + our in-flight)."""
    depth = {c.endpoint.id: c.load.waiting + c.load.inflight_requests for c in candidates}
    lo, hi = min(depth.values()), max(depth.values())
    return {e: 1.0 if hi == lo else (hi - d) / (hi - lo) for e, d in depth.items()}


def kv_score(request: RoutingRequest, candidates: Sequence[Candidate]) -> Mapping[EndpointId, float]:
    """Free KV share; unknown load scores 0."""
    return {c.endpoint.id: (1.0 - c.load.kv_usage) if c.load.known else 0.0 for c in candidates}


SCORERS: dict[str, Scorer] = {"prefix": prefix_score, "queue": queue_score, "kv": kv_score}
