"""Prefill/decode disaggregation: whether to split a request, and the two picks. Pure and synchronous.

The sequence follows llm-d's decode-first profile handler and its prefix-based decider:

1. the profile picks the **decode** endpoint among the decode-capable ones (role decode or both), by its usual
   estimate: load, KV pressure and the prefix that endpoint holds;
2. the request is disaggregated only when the prompt tokens *not* cached on that decode endpoint reach
   ``non_cached_tokens`` (a short or well-cached prompt runs locally: the transfer would cost more than it saves);
3. the **prefill** endpoint is the prefill-capable one (role prefill or both, not the decode pick) with the lowest
   estimated TTFT: its own cached prefix and queued prefill, through the same estimator, plus the KV transfer of
   the blocks the decode endpoint lacks (``kv_transfer_setup_s + tokens * kv_transfer_s_per_token``);
4. when even that best prefill estimate is more than ``max_extra_ttft_s`` above running locally on the decode pick,
   the prefill pool counts as saturated and the request runs locally.

Disaggregation engages only while some eligible endpoint has role prefill, so an aggregated fleet is untouched.
The caller (``extproc.decider``) writes the prefill pick as ``wire.PREFILLER_HEADER``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass

from extproc.scheduling.estimate import EstimatorParams, cached_tokens, estimate_ttft_s
from extproc.scheduling.profiles import Profile
from extproc.types import Candidate, Decision, EndpointId, Role, RoutingRequest


class PdReason(enum.StrEnum):
    """Why a request was or was not disaggregated; logged and counted."""

    DISAGG = "disagg"  # prefill on another endpoint, decode on the pick
    SHORT = "short"  # the decode pick's uncached suffix is below the threshold
    NO_PREFILL = "no_prefill"  # no prefill-capable endpoint besides the decode pick
    SATURATED = "saturated"  # the best prefill estimate (with the transfer) is too far above running locally


@dataclass(frozen=True, slots=True)
class PdChoice:
    """The P/D half of a decision. ``prefill`` None: run locally on the decode pick."""

    prefill: EndpointId | None
    reason: PdReason
    uncached_tokens: int  # prompt tokens the decode pick lacks
    local_s: float  # estimated TTFT running locally on the decode pick
    disagg_s: float | None = None  # estimated TTFT through the best prefill endpoint, transfer included
    transfer_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PdPolicy:
    """The decider's settings; no defaults here (``config.PdConfig`` holds them and says what each is)."""

    params: EstimatorParams
    non_cached_tokens: int
    max_extra_ttft_s: float
    kv_transfer_s_per_token: float
    kv_transfer_setup_s: float

    def choose(self, request: RoutingRequest, decode: Candidate, prefill_pool: Sequence[Candidate]) -> PdChoice:
        """Disaggregate ``request`` (decode already picked) or not, and where to prefill."""
        bs = request.block_size
        uncached = max(request.prompt_tokens - cached_tokens(decode, request.prompt_tokens, bs), 0)
        local_s = estimate_ttft_s(decode, request.prompt_tokens, bs, self.params)
        if self.non_cached_tokens <= 0 or request.prompt_tokens == 0 or uncached < self.non_cached_tokens:
            return PdChoice(None, PdReason.SHORT, uncached, local_s)
        pool = [c for c in prefill_pool if c.endpoint.id != decode.endpoint.id]
        if not pool:
            return PdChoice(None, PdReason.NO_PREFILL, uncached, local_s)
        transfer_s = self.kv_transfer_setup_s + uncached * self.kv_transfer_s_per_token
        est = {c.endpoint.id: estimate_ttft_s(c, request.prompt_tokens, bs, self.params) for c in pool}
        best = min(sorted(est), key=lambda e: est[e])  # ties: the lowest id, deterministic
        disagg_s = est[best] + transfer_s
        if disagg_s > local_s + self.max_extra_ttft_s:
            return PdChoice(None, PdReason.SATURATED, uncached, local_s, disagg_s, transfer_s)
        return PdChoice(best, PdReason.DISAGG, uncached, local_s, disagg_s, transfer_s)


def split_roles(candidates: Sequence[Candidate]) -> tuple[list[Candidate], list[Candidate]] | None:
    """``(decode-capable, prefill-capable)``, or None when no candidate has role prefill (no P/D at all).

    Every candidate is prefill-only: they all stay decode candidates, since a request must go somewhere.
    """
    if not any(c.endpoint.role is Role.PREFILL for c in candidates):
        return None
    decode = [c for c in candidates if c.endpoint.role is not Role.PREFILL]
    prefill = [c for c in candidates if c.endpoint.role is not Role.DECODE]
    return (decode or list(candidates)), prefill


def decide(
    profile: Profile,
    policy: PdPolicy | None,
    request: RoutingRequest,
    candidates: Sequence[Candidate],
    rng: random.Random,
) -> tuple[Decision, PdChoice | None]:
    """The profile's decision over the decode-capable candidates, then the P/D choice (None: no P/D fleet)."""
    roles = None if policy is None else split_roles(candidates)
    if policy is None or roles is None:
        return profile.decide(request, candidates, rng), None
    decode_pool, prefill_pool = roles
    decision = profile.decide(request, decode_pool, rng)
    pick = next(c for c in decode_pool if c.endpoint.id == decision.endpoints[0])
    return decision, policy.choose(request, pick, prefill_pool)
