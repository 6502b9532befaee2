"""The robust RLS step the calibration's RLS learner is built on (``backends.robust_rls``)."""

import random

import pytest

from extproc.backends.robust_rls import RlsSettings, RlsState, bounded, diagonal, rls_step

PLAIN = RlsSettings(forgetting=1.0, drift=0.0, huber_floor=1e9, error_bound=1e9)  # textbook RLS


def _fit(truth: list[float], samples: int, settings: RlsSettings, *, wild_every: int = 0, seed: int = 0) -> RlsState:
    rng = random.Random(seed)
    prior = diagonal([1e4] * len(truth))  # a weak prior: the data decide
    state = RlsState([0.0] * len(truth), prior, spread=0.1)
    for i in range(samples):
        x = [1.0] + [rng.uniform(0, 1) for _ in truth[1:]]
        y = sum(t * xi for t, xi in zip(truth, x, strict=True))
        if wild_every and i % wild_every == wild_every - 1:
            y *= 5  # an interval that took 5x its terms
        state = rls_step(state, x, y, prior, settings)
    return state


def test_without_noise_it_recovers_the_weights() -> None:
    state = _fit([0.5, 2.0, -1.0], 50, PLAIN)
    assert state.weights == pytest.approx([0.5, 2.0, -1.0], abs=1e-3)


def test_huber_weights_keep_wild_samples_from_pulling() -> None:
    settings = RlsSettings(forgetting=0.995, drift=0.0, huber_floor=0.15, error_bound=1.0)
    robust = _fit([0.5, 2.0, -1.0], 400, settings, wild_every=10)
    plain = _fit([0.5, 2.0, -1.0], 400, PLAIN, wild_every=10)
    miss = [abs(w - t) for w, t in zip(robust.weights, [0.5, 2.0, -1.0], strict=True)]
    plain_miss = [abs(w - t) for w, t in zip(plain.weights, [0.5, 2.0, -1.0], strict=True)]
    assert max(miss) < 0.3 < max(plain_miss)


def test_drift_keeps_following_a_model_that_changed() -> None:
    settings = RlsSettings(forgetting=1.0, drift=0.01, huber_floor=1e9, error_bound=1e9)
    rng = random.Random(1)
    prior = diagonal([1.0, 1.0])
    state = RlsState([0.0, 0.0], prior, spread=0.1)
    for truth in ([0.5, 1.0], [0.5, 3.0]):  # the engine got 3x slower after 500 samples
        for _ in range(500):
            x = [1.0, rng.uniform(0, 1)]
            state = rls_step(state, x, truth[0] + truth[1] * x[1], prior, settings)
    assert state.weights == pytest.approx([0.5, 3.0], abs=0.05)


def test_bounded_scales_the_covariance_down_to_the_prior() -> None:
    prior = diagonal([1.0, 4.0])
    assert bounded([[0.5, 0.1], [0.1, 2.0]], prior) == [[0.5, 0.1], [0.1, 2.0]]
    scaled = bounded([[3.0, 0.3], [0.3, 2.0]], prior)  # the first entry was 3x the prior's: all of it / 3
    assert [v for row in scaled for v in row] == pytest.approx([1.0, 0.1, 0.1, 2.0 / 3.0])
