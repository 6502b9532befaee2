"""Robust recursive least squares: one linear model's weights, refit with each sample, heavy tails damped.

The calibration's RLS learner (``backends/calibration.py``) is built on this; it owns nothing about TTFT. Per
sample ``(x, y)`` with the model ``y ~ weights . x``:

1. the covariance takes the process noise ``drift x prior`` (a Kalman random walk): the weights may keep moving
   after many samples, so a model that was right and is no longer (another load, another engine) is followed;
2. a sample whose error is past ``huber`` is weighed down to Huber's influence (its ``x`` and error scaled by
   ``sqrt(huber / |error|)``), ``huber`` being ``HUBER_K`` x the running mean absolute error but never below the
   caller's floor: far from the truth every error is large and all of them count; near it, the few wild ones do
   not pull;
3. the error is clipped to ``error_bound``; then the textbook update with forgetting factor ``forgetting``;
4. the covariance is scaled down where a diagonal entry exceeds the prior's: forgetting inflates the uncertainty
   of a feature that stays 0, and the first sample that has it would otherwise throw that weight far.

Pure: no clocks, no I/O; lists of floats, four or so weights (no numpy on the hot path's process for 16 numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

HUBER_K = 1.5  # the Huber threshold in running mean absolute errors (~1.2 sigma of a normal error)
SPREAD_WEIGHT = 0.05  # each sample's share of the running mean absolute error

Matrix = list[list[float]]


@dataclass(frozen=True, slots=True)
class RlsSettings:
    forgetting: float  # the weight the past keeps per sample (1: never forget)
    drift: float  # process noise per sample, as a share of the prior covariance
    huber_floor: float  # errors below this always count in full
    error_bound: float  # no sample's error counts beyond this


@dataclass(frozen=True, slots=True)
class RlsState:
    weights: list[float]
    covariance: Matrix
    spread: float  # running mean absolute error (at most 1 per sample)


def diagonal(values: Sequence[float]) -> Matrix:
    """The diagonal matrix of ``values``."""
    return [[v if i == j else 0.0 for j in range(len(values))] for i, v in enumerate(values)]


def rls_step(state: RlsState, x: Sequence[float], y: float, prior: Matrix, settings: RlsSettings) -> RlsState:
    """``state`` refit with the sample ``(x, y)``; ``prior``: the weights' covariance before any sample (the drift's
    shape and the bound on the uncertainty). The caller clamps the weights and bounds the covariance again if
    it moves them (``bounded``)."""
    n = len(x)
    p = [[v + settings.drift * prior[i][j] for j, v in enumerate(row)] for i, row in enumerate(state.covariance)]
    error = y - sum(w * xi for w, xi in zip(state.weights, x, strict=True))
    spread = state.spread + SPREAD_WEIGHT * (min(abs(error), 1.0) - state.spread)
    huber = max(HUBER_K * state.spread, settings.huber_floor)
    if abs(error) > huber:  # Huber's weight huber / |error|, applied as its square root to x and the error
        shrink = (huber / abs(error)) ** 0.5
        x, error = [xi * shrink for xi in x], error * shrink
    error = min(max(error, -settings.error_bound), settings.error_bound)
    lam = settings.forgetting
    px = [sum(row[j] * x[j] for j in range(n)) for row in p]
    gain_div = lam + sum(xi * pxi for xi, pxi in zip(x, px, strict=True))
    gain = [pxi / gain_div for pxi in px]
    weights = [w + g * error for w, g in zip(state.weights, gain, strict=True)]
    covariance = [[(p[i][j] - gain[i] * px[j]) / lam for j in range(n)] for i in range(n)]
    return RlsState(weights, covariance, spread)


def bounded(covariance: Matrix, prior: Matrix) -> Matrix:
    """``covariance`` scaled down so that no diagonal entry exceeds the prior's (step 4 of the module docstring)."""
    excess = max((covariance[i][i] / prior[i][i] for i in range(len(prior)) if prior[i][i] > 0), default=0.0)
    if excess <= 1.0:
        return covariance
    return [[v / excess for v in row] for row in covariance]
