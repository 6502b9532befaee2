"""What one decision tells the world: its metrics, the status tap and the JSON decision line.

``observe`` is called once per routed request, after the pick (``LocalDecider.decide``). The line goes to the
``extproc.decision`` logger at INFO; prompt text appears in it only with ``logging.log_prompts``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from extproc.observability import RouterMetrics
from extproc.scheduling import pd
from extproc.types import Decision, RoutingRequest

log = logging.getLogger("extproc.decision")


@dataclass(frozen=True, slots=True)
class Observed:
    """One decision as the line reports it: ``phases_s`` front and decider merged (``merged_phases``),
    ``ttft_ratio`` the pick's measured actual / predicted TTFT (1.0 until measured), ``body_head`` the body's
    first bytes (empty unless prompts are logged)."""

    routing: RoutingRequest
    decision: Decision
    split: pd.PdChoice | None
    phases_s: Mapping[str, float]
    ttft_ratio: float
    body_head: bytes = b""


def observe(metrics: RouterMetrics, seen: Observed, *, log_prompts: bool) -> None:
    """Count the decision, feed the status tap and the phase histograms, and write the decision line."""
    routing, decision, split = seen.routing, seen.decision, seen.split
    metrics.decisions.labels(decision.reason.value).inc()
    if split is not None:
        metrics.pd_decisions.labels(split.reason.value).inc()
    metrics.cached_tokens.inc(decision.cached_tokens)
    metrics.prompt_tokens.inc(routing.prompt_tokens)
    metrics.tap.decided(routing, decision)
    for phase, seconds in seen.phases_s.items():
        metrics.phase_seconds.labels(phase).observe(seconds)
    if log.isEnabledFor(logging.INFO):
        log.info(json.dumps(_line(seen, log_prompts=log_prompts)))


def _line(seen: Observed, *, log_prompts: bool) -> dict[str, object]:
    routing, decision, split = seen.routing, seen.decision, seen.split
    extra: dict[str, object] = {}
    if log_prompts:
        extra["body_head"] = seen.body_head.decode(errors="replace")
    if split is not None:
        extra["pd"] = {"prefill": split.prefill, "reason": split.reason.value, "uncached": split.uncached_tokens}
    if decision.due_s:  # chains' calls due where this request could go (``scheduling.due_calls``)
        extra["due_s"] = {e: round(v, 4) for e, v in decision.due_s.items()}
    return {
        **extra,
        "request_id": routing.request_id,
        "model": routing.model,
        "tenant": routing.tenant.id,
        "endpoint": decision.endpoints[0],
        "fallbacks": decision.endpoints[1:],
        "reason": decision.reason.value,
        "prompt_tokens": routing.prompt_tokens,
        "cached_tokens": decision.cached_tokens,
        "estimates_s": {e: round(v, 4) for e, v in decision.estimates_s.items()},
        "ttft_ratio": round(seen.ttft_ratio, 3),
        "scores": {e: round(v, 4) for e, v in decision.scores.items()},
        "ms": {k: round(v * 1000, 3) for k, v in seen.phases_s.items()},
    }


def merged_phases(front_s: Mapping[str, float], decider_s: Mapping[str, float]) -> dict[str, float]:
    """The front's phases, then the decider's; ``total`` is both totals (the socket hop, if any, excluded)."""
    out = {k: v for k, v in front_s.items() if k != "total"}
    out.update((k, v) for k, v in decider_s.items() if k != "total")
    out["total"] = sum(out.values())
    return out
