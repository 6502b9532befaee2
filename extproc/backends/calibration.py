"""Predicted against actual time to first token, per endpoint: the TTFT estimate checked against what happened.

The decision predicts each pick's TTFT (``scheduling.estimate``); the engine counts what its requests really
waited (``vllm:time_to_first_token_seconds`` ``_sum``/``_count``, through ``EngineMetrics.ttft``). Between two
scrapes of an endpoint we compare the mean predicted TTFT of the requests we routed there with the mean TTFT
the engine reports for the requests that got their first token meanwhile. The two sets are not the same
requests (a request routed just before a scrape gets its first token after it), so an interval is one noisy
sample; many intervals give the error's distribution and the ratio actual / predicted, the factor a calibrated
estimate would apply.

Measure-only for now: nothing here changes a decision. When: ``predicted`` once per decision (from the decider),
``observe`` with each endpoint's latest scrape (the decider passes the record it already holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from extproc.backends.vllm_metrics import PhaseTotals
from extproc.types import EndpointId

_RATIO_WEIGHT = 0.1  # each interval's share of the running actual / predicted ratio


class ErrorSink(Protocol):
    """Where interval errors go (``RouterMetrics``' histogram and gauges, or a test's list)."""

    def interval(self, endpoint: EndpointId, predicted_s: float, actual_s: float, ratio: float) -> None: ...


@dataclass(slots=True)
class _Endpoint:
    seen: PhaseTotals | None = None  # the engine's totals at the last interval's end
    predicted_s: float = 0.0  # summed predictions of requests routed since then
    routed: int = 0
    ratio: float = 1.0  # running actual / predicted


class TtftCalibration:
    """Per endpoint: predictions since the last scrape, the engine's totals then, the running ratio."""

    def __init__(self, sink: ErrorSink) -> None:
        self._sink = sink
        self._eps: dict[EndpointId, _Endpoint] = {}

    def predicted(self, endpoint: EndpointId, ttft_s: float) -> None:
        """The decision routed a request to ``endpoint`` expecting ``ttft_s``."""
        ep = self._eps.setdefault(endpoint, _Endpoint())
        ep.predicted_s += ttft_s
        ep.routed += 1

    def observe(self, endpoint: EndpointId, totals: PhaseTotals | None) -> None:
        """The engine's cumulative TTFT totals as last scraped; closes an interval when they moved."""
        if totals is None:
            return
        ep = self._eps.setdefault(endpoint, _Endpoint())
        prev, ep.seen = ep.seen, totals
        if prev is None or totals.requests < prev.requests:  # first sight, or the engine restarted
            ep.predicted_s, ep.routed = 0.0, 0
            return
        done = totals.requests - prev.requests
        if done <= 0:
            ep.seen = prev  # nothing finished its prefill: keep accumulating
            return
        if ep.routed:
            predicted = ep.predicted_s / ep.routed
            actual = (totals.seconds - prev.seconds) / done
            if predicted > 0 and actual > 0:
                ep.ratio += _RATIO_WEIGHT * (actual / predicted - ep.ratio)
                self._sink.interval(endpoint, predicted, actual, ep.ratio)
        ep.predicted_s, ep.routed = 0.0, 0

    def ratio(self, endpoint: EndpointId) -> float:
        """The running actual / predicted TTFT of ``endpoint`` (1.0 until measured)."""
        ep = self._eps.get(endpoint)
        return ep.ratio if ep else 1.0

    def forget(self, endpoint: EndpointId) -> None:
        self._eps.pop(endpoint, None)
