"""Time-to-first-token estimate for one request on one candidate endpoint.

The model: the request waits for the prefill work queued ahead of it, then its own *uncached* tokens are
prefilled. Both run at the endpoint's prefill rate, slowed by the decode batch sharing each step. Requests
waiting for a slot add a fixed overhead each; a KV cache near full delays admission; an endpoint whose load we
cannot read is not assumed idle. Pure: no clocks, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from extproc.types import Candidate


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


def estimate_ttft_s(candidate: Candidate, prompt_tokens: int, block_size: int, params: EstimatorParams) -> float:
    """Estimated seconds until the first token if this request went to ``candidate`` now."""
    load = candidate.load
    uncached = max(prompt_tokens - cached_tokens(candidate, prompt_tokens, block_size), 1)
    slowdown = 1.0 + params.decode_slowdown_per_running * load.running
    prefill_s = (load.queued_prefill_tokens + uncached) / params.prefill_tokens_per_s * slowdown
    queue_s = (load.waiting + load.inflight_requests) * params.request_overhead_s
    kv_s = 0.0
    if load.kv_usage > params.kv_pressure_threshold:
        excess = (load.kv_usage - params.kv_pressure_threshold) / max(1e-9, 1 - params.kv_pressure_threshold)
        kv_s = excess * params.kv_penalty_s
    unknown_s = 0.0 if load.known else params.unknown_load_penalty_s
    return prefill_s + queue_s + kv_s + unknown_s
