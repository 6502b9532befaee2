"""Predicted against actual time to first token, per endpoint: the TTFT estimate checked against what happened,
and a cost model learned from the difference.

The decision predicts each pick's TTFT (``scheduling.estimate``); the engine counts what its requests really
waited (``vllm:time_to_first_token_seconds`` ``_sum``/``_count``, through ``EngineMetrics.ttft``). When the
engine's count moved by n between two scrapes of an endpoint, n of its requests got their first token meanwhile:
we take the n oldest predictions still open for that endpoint (routed first, served first: vLLM schedules in
arrival order) and compare their mean with the engine's mean over the interval. Matching by count pairs a prefill
that took three scrapes with its own prediction. Comparing what was *routed* in an interval with what *finished*
in it (until December 2026) did not: replayed from a cell trace of unique prompts at 16 req/s, the per-request
error's p50 is 0.17, routed-against-finished intervals' 0.28, paired intervals' 0.17
(bench/results/fifo-calibration).
The pairing is exact when every request the engine counts was routed by this picker, in order; another
router's requests in the same engine (a fail-open request, a replica that does not share its predictions) make an
interval's sets differ, and a prediction the engine never counts (an aborted request) is dropped after
``ABANDONED_S``. Replicas sharing Redis tell each other every prediction (``on_predicted`` publishes ours,
``heard`` queues theirs in arrival order, ``redis.touches``): each pairs the engine's first tokens with the whole
fleet's requests. Without them, two replicas each paired half an engine's requests with the engine's count: the
error's p50 bucket 0.2-0.5 on documents and mooncake where one replica's was 0.1-0.3
(``bench/results/shared-predictions/notes.md``).

**Learning** (``CostLearning``; ``docs/scheduling.md``). The estimate is linear in four weights of its own terms
(``types.LearnedCost``): a fixed per-request cost, the prefill rate, the decode interference per running request
and the queue's drain. Each closed interval is one sample (mean terms of the predictions it was paired with, the
engine's mean TTFT). Two learners (``learner``): ``nlms`` takes one normalized least-mean-squares step toward the
sample, on features scaled by their running RMS (so the one-second constant does not drown the token terms), with
the step's error clipped to half the sample's size; ``rls`` refits all four weights on every interval's relative
error (``_learn_rls``, ``robust_rls``). Either way every weight is clamped to its bounds. The decision reads the
result as ``Candidate.cost``; it stays pure.

When: ``predicted`` once per decision (from the decider), ``observe`` with each endpoint's latest scrape (the
decider passes the record it already holds).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from extproc.backends.robust_rls import RlsSettings, RlsState, bounded, diagonal, rls_step
from extproc.backends.vllm_metrics import PhaseTotals
from extproc.types import EndpointId, LearnedCost, Prediction

_RATIO_WEIGHT = 0.1  # each interval's share of the running actual / predicted ratio
_RMS_WEIGHT = 0.05  # each interval's share of a feature's running mean square
_FEATURES = 4  # (1, work, work x running, queue): ``scheduling.estimate.CostTerms.features``
_FLOOR = 1e-12
# A feature's running mean square never drops below this (10 ms squared; the constant feature is 1 anyway). The
# step normalizes each feature by its RMS, so without a floor the first interval of a short prompt (an 11-token
# request: work 1 ms) scales that feature up to 1 and moves the prefill weight by error / work: one "hi" put the
# prefill rate at its 4x bound and every long prompt after it was priced 4x (a P/D split read it as saturation).
# Terms this small are below one engine step and cannot be told from the fixed cost, which then learns the error.
_MEAN_SQUARE_FLOOR = 0.01**2
LEARNER_NLMS, LEARNER_RLS = "nlms", "rls"
# The RLS learner (``robust_rls``). Its prior: each weight's standard deviation is its own size, the interference's
# its bound, the fixed cost's never below the configured one (or a twentieth of its bound) times the learned
# prefill scale. The samples are relative, so an engine 4x slower than configured gives samples 4x smaller: a prior
# that grows with the weights lets it be learned as fast as one 4x faster (with the configured spans, 4x faster
# stayed at 45% error after 600 intervals). Then a little process noise, errors past the running spread weighed
# down, and no interval's relative error beyond 1.
_RLS_BASE_FLOOR = 0.05  # of max_base_s
_RLS_SETTINGS = {"drift": 0.01, "huber_floor": 0.15, "error_bound": 1.0}
ABANDONED_S = 60.0
"""A prediction the engine has not counted a first token for this long after routing is dropped: the request was
aborted or failed (or went elsewhere), and left open it would pair with a later request's first token."""


class ErrorSink(Protocol):
    """Where interval errors and learned costs go (``RouterMetrics``' histogram and gauges, or a test's list)."""

    def interval(self, endpoint: EndpointId, predicted_s: float, actual_s: float, ratio: float) -> None: ...

    def learned(self, endpoint: EndpointId, cost: LearnedCost, prefill_tokens_per_s: float) -> None: ...


@dataclass(frozen=True, slots=True)
class CostLearning:
    """How the cost model learns (``config.CostModelConfig``; no defaults here). ``prior``: the configured
    estimate as weights; ``prefill_tokens_per_s``: the configured rate (to export the learned one)."""

    learn: bool
    learning_rate: float
    max_base_s: float
    max_scale: float
    max_interference_per_running: float
    pooled_share: float
    prior: LearnedCost
    prefill_tokens_per_s: float
    learner: str  # LEARNER_NLMS | LEARNER_RLS
    forgetting: float  # the RLS learner's weight on the past, per interval


@dataclass(frozen=True, slots=True)
class _Prediction:
    at_s: float  # when it was routed (the calibration's clock)
    ttft_s: float
    features: tuple[float, ...]  # ``CostTerms.features()``; empty: nothing to learn from
    fixed_s: float  # unlearned terms


@dataclass(slots=True)
class _Endpoint:
    seen: PhaseTotals | None = None  # the engine's totals at the last interval's end
    open: deque[_Prediction] = field(default_factory=deque)  # routed here, first token not counted yet, oldest first
    ratio: float = 1.0  # running actual / predicted
    weights: list[float] | None = None  # (base, scale, scale x interference, queue scale); None: not learned
    mean_square: list[float] | None = None  # of each feature, running (the NLMS learner's)
    rls: RlsState | None = None  # the RLS learner's state (its weights are ``weights``)


@dataclass(frozen=True, slots=True)
class _Interval:
    """The predictions an interval's first tokens are paired with: their mean TTFT, features and unlearned terms."""

    predicted_s: float
    features: list[float]
    fixed_s: float

    @classmethod
    def of(cls, matched: Sequence[_Prediction]) -> _Interval:
        n = len(matched)
        learnable = [p.features for p in matched if len(p.features) >= _FEATURES]
        features = [sum(f[i] for f in learnable) / n for i in range(_FEATURES)] if len(learnable) == n else []
        return cls(sum(p.ttft_s for p in matched) / n, features, sum(p.fixed_s for p in matched) / n)


class TtftCalibration:
    """Per endpoint: the predictions no first token was paired with yet, the engine's totals at the last
    interval's end, the running ratio and the learned weights."""

    def __init__(
        self,
        sink: ErrorSink,
        learning: CostLearning,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_predicted: Callable[[Prediction], None] | None = None,
    ) -> None:
        """``on_predicted``: told each prediction this replica makes (``predicted``), for the other replicas."""
        self._sink = sink
        self._learning = learning
        self._clock = clock
        self._on_predicted = on_predicted
        self._eps: dict[EndpointId, _Endpoint] = {}
        self._pooled: list[float] | None = None  # the taught endpoints' mean weights, until any weights change
        self._rls = RlsSettings(forgetting=learning.forgetting, **_RLS_SETTINGS)

    def predicted(
        self, endpoint: EndpointId, ttft_s: float, features: Sequence[float] = (), fixed_s: float = 0.0
    ) -> None:
        """The decision routed a request to ``endpoint`` expecting ``ttft_s``, from the estimate's ``features``
        (``CostTerms.features()``; empty: nothing to learn from) and unlearned ``fixed_s``."""
        terms = tuple(features[:_FEATURES])
        self._open(endpoint, ttft_s, terms, fixed_s)
        if self._on_predicted is not None:
            self._on_predicted(Prediction(endpoint, ttft_s, terms, fixed_s))

    def heard(self, prediction: Prediction) -> None:
        """Another replica routed a request to ``prediction.endpoint`` expecting ``prediction.ttft_s``: it takes
        its place among the open predictions as if this replica had routed it now. Not told to ``on_predicted``."""
        self._open(prediction.endpoint, prediction.ttft_s, tuple(prediction.features[:_FEATURES]), prediction.fixed_s)

    def _open(self, endpoint: EndpointId, ttft_s: float, features: tuple[float, ...], fixed_s: float) -> None:
        ep = self._eps.setdefault(endpoint, _Endpoint())
        self._drop_abandoned(ep)  # also bounds what an endpoint that is never scraped holds
        ep.open.append(_Prediction(self._clock(), ttft_s, features, fixed_s))

    def observe(self, endpoint: EndpointId, totals: PhaseTotals | None) -> None:
        """The engine's cumulative TTFT totals as last scraped; closes an interval when they moved, pairing its
        first tokens with the oldest open predictions (module docstring)."""
        if totals is None:
            return
        ep = self._eps.setdefault(endpoint, _Endpoint())
        prev, ep.seen = ep.seen, totals
        if prev is None or totals.requests < prev.requests:  # first sight, or the engine restarted
            ep.open.clear()  # which of them the engine counted already is unknown
            return
        done = int(totals.requests - prev.requests)
        if done <= 0:
            ep.seen = prev  # nothing finished its prefill: keep the interval open
            return
        matched = [ep.open.popleft() for _ in range(min(done, len(ep.open)))]
        self._drop_abandoned(ep)
        if not matched:
            return
        interval, actual = _Interval.of(matched), (totals.seconds - prev.seconds) / done
        if interval.predicted_s > 0 and actual > 0:
            ep.ratio += _RATIO_WEIGHT * (actual / interval.predicted_s - ep.ratio)
            self._sink.interval(endpoint, interval.predicted_s, actual, ep.ratio)
            if self._learning.learn and interval.features and interval.features[0] > 0:
                if self._learning.learner == LEARNER_RLS:
                    self._learn_rls(endpoint, ep, interval, actual)
                else:
                    self._learn(endpoint, ep, interval, actual)

    def _drop_abandoned(self, ep: _Endpoint) -> None:
        oldest = self._clock() - ABANDONED_S
        while ep.open and ep.open[0].at_s < oldest:
            ep.open.popleft()

    def ratio(self, endpoint: EndpointId) -> float:
        """The running actual / predicted TTFT of ``endpoint`` (1.0 until measured)."""
        ep = self._eps.get(endpoint)
        return ep.ratio if ep else 1.0

    def cost(self, endpoint: EndpointId) -> LearnedCost | None:
        """``endpoint``'s learned cost model: its own weights blended with the taught endpoints' mean by
        ``pooled_share``. One not taught yet (no traffic, or just joined) gets the mean: an untaught endpoint
        priced by the configured estimate would look cheaper than every taught one only because nothing
        corrected it yet. None while nothing is learned (or learning is off).

        Why pool: on endpoints of one hardware the weights differ only by each one's noise, and a flood placed
        by the estimate then leans on whichever learned cheapest (bench/results/merged-e81c463)."""
        mean = self._pooled_mean()
        if mean is None:
            return None
        ep = self._eps.get(endpoint)
        if ep is None or ep.weights is None:
            return _as_cost(mean)
        share = self._learning.pooled_share
        return _as_cost([share * m + (1.0 - share) * own for m, own in zip(mean, ep.weights, strict=True)])

    def _pooled_mean(self) -> list[float] | None:
        """The taught endpoints' mean weights (None: none taught), kept until any weights change: a decision
        asks for every candidate's cost, which would make it quadratic in the fleet."""
        if self._pooled is None:
            taught = [e.weights for e in self._eps.values() if e.weights is not None]
            if taught:
                self._pooled = [sum(w[i] for w in taught) / len(taught) for i in range(_FEATURES)]
        return self._pooled

    def forget(self, endpoint: EndpointId) -> None:
        self._eps.pop(endpoint, None)
        self._pooled = None

    def _learn(self, endpoint: EndpointId, ep: _Endpoint, interval: _Interval, actual_s: float) -> None:
        """One normalized LMS step of ``ep``'s weights toward this interval's mean (module docstring)."""
        f = interval.features
        target = actual_s - interval.fixed_s
        w = ep.weights if ep.weights is not None else _as_weights(self._learning.prior)
        ms = ep.mean_square if ep.mean_square is not None else [x * x for x in f]  # floored just below
        ms = [max(m + _RMS_WEIGHT * (x * x - m), _MEAN_SQUARE_FLOOR) for m, x in zip(ms, f, strict=True)]
        guess = sum(wi * fi for wi, fi in zip(w, f, strict=True))
        bound = 0.5 * (abs(target) + abs(guess))
        error = min(max(target - guess, -bound), bound)
        norm = sum(x * x / m for x, m in zip(f, ms, strict=True)) + _FLOOR
        step = self._learning.learning_rate * error / norm
        w = [wi + step * fi / m for wi, fi, m in zip(w, f, ms, strict=True)]
        ep.weights, ep.mean_square = self._clamped(w), ms
        self._taught(endpoint, ep)

    def _learn_rls(self, endpoint: EndpointId, ep: _Endpoint, interval: _Interval, actual_s: float) -> None:
        """One recursive-least-squares step of ``ep``'s weights on this interval's *relative* error.

        Why not the NLMS step: its error is in seconds, so the few intervals that took a second longer than their
        terms (a long prompt, or a short one sharing its step with a long one routed just after it) set the
        direction of every step, along the feature that is largest on them (work x running), and the weights
        tracked those (mooncake at 16 req/s: interference 0.004 -> 0.05 per running request, every large batch
        then priced 16-48% high; ``bench/results/rls-learner/notes.md``). Here each interval is one sample of
        ``(actual - fixed) / actual = weights . features / actual``: a request that took 2x its terms counts as
        much as one of 0.1 s that did, and the step solves for all four weights at once from every interval
        seen (forgetting a share ``1 - forgetting`` of the past per interval) instead of moving along one.
        """
        w = ep.weights if ep.weights is not None else _as_weights(self._learning.prior)
        state = ep.rls if ep.rls is not None else RlsState(w, self._prior_covariance(w), self._rls.huber_floor)
        x = [f / actual_s for f in interval.features]
        target = (actual_s - interval.fixed_s) / actual_s
        state = rls_step(state, x, target, self._prior_covariance(state.weights), self._rls)
        weights = self._clamped(state.weights)
        ep.weights = weights
        ep.rls = RlsState(weights, bounded(state.covariance, self._prior_covariance(weights)), state.spread)
        self._taught(endpoint, ep)

    def _prior_covariance(self, w: Sequence[float]) -> list[list[float]]:
        """Each weight's variance before any interval: its own size squared (module constants' comment)."""
        lm = self._learning
        base_floor = max(lm.prior.base_s, _RLS_BASE_FLOOR * lm.max_base_s) * w[1] / lm.prior.prefill_scale
        spans = (max(w[0], base_floor), w[1], w[1] * lm.max_interference_per_running, w[3])
        return diagonal([s * s for s in spans])

    def _taught(self, endpoint: EndpointId, ep: _Endpoint) -> None:
        assert ep.weights is not None
        self._pooled = None
        cost = _as_cost(ep.weights)
        self._sink.learned(endpoint, cost, self._learning.prefill_tokens_per_s / cost.prefill_scale)

    def _clamped(self, w: list[float]) -> list[float]:
        lo, hi = 1.0 / self._learning.max_scale, self._learning.max_scale
        scale = min(max(w[1], lo), hi)
        return [
            min(max(w[0], 0.0), self._learning.max_base_s),
            scale,
            min(max(w[2], 0.0), scale * self._learning.max_interference_per_running),
            min(max(w[3], lo), hi),
        ]


def _as_weights(cost: LearnedCost) -> list[float]:
    """The cost model as the linear weights of ``CostTerms.features()``."""
    return [cost.base_s, cost.prefill_scale, cost.prefill_scale * cost.interference_per_running, cost.queue_scale]


def _as_cost(w: Sequence[float]) -> LearnedCost:
    return LearnedCost(base_s=w[0], prefill_scale=w[1], interference_per_running=w[2] / w[1], queue_scale=w[3])
