"""Time-to-first-token estimate for one request on one candidate endpoint.

The model: the request waits for the prefill work queued ahead of it, then its own *uncached* tokens are
prefilled. Both run at the endpoint's prefill rate, slowed by the decode batch sharing each step. Requests
waiting for a slot add a fixed overhead each; a KV cache near full delays admission; an endpoint whose load we
cannot read is not assumed idle. The configured constants give each term; an endpoint's learned cost model
(``Candidate.cost``, learned by ``backends.calibration``) reweighs them. Pure: no clocks, no I/O.

The busy floor is a lower bound the terms miss: the engine runs one step at a time, so while a prefill we
routed there is predicted to run (``LoadSnapshot.prefill_busy_s``), this request's own prefill starts after it
(the token queue drains from the moment of routing, at the prefill rate alone). ``floor_share`` says how much of
what the floor adds above the terms counts: the profile counts it as far as requests continue chains, where the
wait comes back on every call (``docs/scheduling.md``, "Chains that start beside a prefill"); 0 is the terms
alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.types import Candidate, LearnedCost


@dataclass(frozen=True, slots=True)
class EstimatorParams:
    """The estimate's constants; no defaults here: ``config.TtftProfileConfig`` holds them (and says what each is)."""

    prefill_tokens_per_s: float
    decode_slowdown_per_running: float
    request_overhead_s: float
    kv_pressure_threshold: float
    kv_penalty_s: float
    unknown_load_penalty_s: float


def cached_tokens(candidate: Candidate, prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens the candidate would serve from cache. vLLM always recomputes the last prompt token."""
    if prompt_tokens <= 0:
        return 0
    usable_blocks = (prompt_tokens - 1) // block_size
    return min(candidate.cached_blocks, usable_blocks) * block_size


def copy_fits(candidate: Candidate, prompt_tokens: int, block_size: int) -> bool:
    """Whether the candidate's prefix cache has room for the blocks this request would add there without evicting
    a block that recent requests hit (``Candidate.hot_blocks``) or that running requests hold (``kv_usage``).

    A copy that evicts another hot prefix makes that prefix's next request cold, and its placement evicts a
    third: the spill cascade (``docs/scheduling.md``). Unknown capacity or hot set: no bound known, it fits.
    """
    capacity = candidate.endpoint.num_gpu_blocks
    if capacity is None or candidate.hot_blocks is None:
        return True
    usable_blocks = max(prompt_tokens - 1, 0) // block_size
    new_blocks = max(usable_blocks - candidate.cached_blocks, 0)
    # Blocks running requests hold cannot be evicted either; counting them beside the hot set double-counts a
    # hot prefix in use, which errs on the side of not copying.
    in_use = candidate.load.kv_usage * capacity
    return candidate.hot_blocks + in_use + new_blocks <= capacity


@dataclass(frozen=True, slots=True)
class CostTerms:
    """The estimate's terms for one request on one candidate, in the configured model's seconds; the learned
    cost model (``types.LearnedCost``) weighs them. ``fixed_s`` (KV pressure, unknown load) is not learned."""

    work_s: float  # prefill queued ahead plus this request's uncached tokens, at the configured rate
    running: int  # requests in the decode batch the prefill shares steps with
    queue_s: float  # waiting requests and ours not yet at their first token, at the configured per-request overhead
    fixed_s: float
    own_work_s: float = 0.0  # this request's uncached tokens alone, at the configured rate
    busy_s: float = 0.0  # a prefill we routed there is predicted to run this long yet (the busy floor)
    floor_share: float = 0.0  # how much of what the busy floor adds above the terms counts (0..1)

    def features(self) -> tuple[float, float, float, float]:
        """What each learned weight multiplies: (1, work, work x running, queue); ``LearnedCost``'s order."""
        return 1.0, self.work_s, self.work_s * self.running, self.queue_s

    def unlearned_s(self, cost: LearnedCost) -> float:
        """The part of ``ttft_s(self, cost)`` no weight produced: the fixed penalties and the busy floor's share
        (the calibration learns the weights from the rest)."""
        return self.fixed_s + self.floor_share * _floor_excess_s(self, cost, _weighted_s(self, cost))


def configured_cost(params: EstimatorParams) -> LearnedCost:
    """The configured estimate as a cost model: what an endpoint starts from before anything is learned.

    Its fixed cost is the configured per-request overhead: a request pays its own turn, as each one queued ahead
    of it does (``queue_s``). Left at 0, the untaught estimate ran 18-35% low on the simulator, and the first
    learning steps put that error on the decode interference (to its bound) before the fixed cost caught up, so
    a new picker decided worse for its first ~40 s of traffic (``docs/scheduling.md``, "The untaught start"). The
    fixed cost is the same on every candidate, so the configured estimate ranks them as before."""
    return LearnedCost(
        base_s=params.request_overhead_s,
        prefill_scale=1.0,
        interference_per_running=params.decode_slowdown_per_running,
        queue_scale=1.0,
    )


def cost_terms(
    candidate: Candidate, prompt_tokens: int, block_size: int, params: EstimatorParams, floor_share: float = 0.0
) -> CostTerms:
    """The estimate's terms if this request went to ``candidate`` now."""
    load = candidate.load
    uncached = max(prompt_tokens - cached_tokens(candidate, prompt_tokens, block_size), 1)
    work_s = (load.queued_prefill_tokens + uncached) / params.prefill_tokens_per_s
    queue_s = (load.waiting + load.queued_requests) * params.request_overhead_s
    kv_s = 0.0
    if load.kv_usage > params.kv_pressure_threshold:
        excess = (load.kv_usage - params.kv_pressure_threshold) / max(1e-9, 1 - params.kv_pressure_threshold)
        kv_s = excess * params.kv_penalty_s
    unknown_s = 0.0 if load.known else params.unknown_load_penalty_s
    return CostTerms(
        work_s=work_s, running=load.running, queue_s=queue_s, fixed_s=kv_s + unknown_s,
        own_work_s=uncached / params.prefill_tokens_per_s, busy_s=load.prefill_busy_s,
        floor_share=min(max(floor_share, 0.0), 1.0),
    )  # fmt: skip


def ttft_s(terms: CostTerms, cost: LearnedCost) -> float:
    """The TTFT ``cost`` predicts from ``terms``: the weighted terms, and the busy floor's share above them."""
    weighted_s = _weighted_s(terms, cost)
    return weighted_s + terms.floor_share * _floor_excess_s(terms, cost, weighted_s) + terms.fixed_s


def _slowdown(terms: CostTerms, cost: LearnedCost) -> float:
    """The prefill's slowdown by the decode batch it shares steps with."""
    return 1.0 + cost.interference_per_running * terms.running


def _weighted_s(terms: CostTerms, cost: LearnedCost) -> float:
    prefill_s = cost.prefill_scale * terms.work_s * _slowdown(terms, cost)
    return cost.base_s + prefill_s + cost.queue_scale * terms.queue_s


def _floor_excess_s(terms: CostTerms, cost: LearnedCost, weighted_s: float) -> float:
    """What the busy floor (the prefill we routed that is predicted to run yet, then this request's own on an
    otherwise idle engine) adds above ``weighted_s``, the weighted terms; 0 when none of ours runs there."""
    if terms.busy_s <= 0:
        return 0.0
    floor_s = terms.busy_s + cost.base_s + cost.prefill_scale * terms.own_work_s * _slowdown(terms, cost)
    return max(floor_s - weighted_s, 0.0)


def imposed_s(candidate: Candidate, prompt_tokens: int, block_size: int, params: EstimatorParams) -> float:
    """What sending this request to ``candidate`` adds to the TTFT of the requests there that have not started
    yet: the engine builds its next step from every request waiting at its start (up to its token budget), and a
    request's first token comes when its step ends, so this request's own prefill lengthens the step of each
    one it joins. Counted: the waiting requests of the candidate's load (the page's, aged by our clock) and ours
    routed there since the page that are before their predicted first token (some may be running already: an
    upper bound). Each is delayed by this request's own prefill at the learned rate.

    Traced in tenants at 24 req/s: a warm request waiting behind one cold prefill got its first token 0.65 s
    after arrival, not the predicted 0.31 s, because a second cold prefill routed there after it joined its
    step (``bench/results/queued-turns/notes.md``; the profile's use: ``docs/scheduling.md``, "Not beside a
    waiting request")."""
    load = candidate.load
    ahead = load.waiting + load.queued_requests
    if ahead <= 0:
        return 0.0
    terms = cost_terms(candidate, prompt_tokens, block_size, params)
    cost = candidate.cost or configured_cost(params)
    return ahead * cost.prefill_scale * terms.own_work_s * _slowdown(terms, cost)


def estimate_ttft_s(
    candidate: Candidate, prompt_tokens: int, block_size: int, params: EstimatorParams, floor_share: float = 0.0
) -> float:
    """Estimated seconds until the first token if this request went to ``candidate`` now: the candidate's
    learned cost model (``Candidate.cost``) if it has one, else the configured one; ``floor_share`` of the busy
    floor (module docstring)."""
    terms = cost_terms(candidate, prompt_tokens, block_size, params, floor_share)
    return ttft_s(terms, candidate.cost or configured_cost(params))
