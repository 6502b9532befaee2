"""Predicted against actual TTFT per scrape interval, and the cost model learned from it
(``backends.calibration``)."""

import random

import pytest

from extproc.app import cost_learning
from extproc.backends.calibration import ABANDONED_S, CostLearning, TtftCalibration
from extproc.backends.vllm_metrics import PhaseTotals
from extproc.config import SchedulingConfig, TtftProfileConfig
from extproc.scheduling.estimate import CostTerms, ttft_s
from extproc.types import EndpointId, LearnedCost, Prediction

A, B = EndpointId("a:1"), EndpointId("b:1")
PRIOR = LearnedCost(base_s=0.0, prefill_scale=1.0, interference_per_running=0.004, queue_scale=1.0)


class Sink:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float, float, float]] = []
        self.costs: list[tuple[str, LearnedCost, float]] = []

    def interval(self, endpoint: str, predicted_s: float, actual_s: float, ratio: float) -> None:
        self.seen.append((endpoint, predicted_s, actual_s, ratio))

    def learned(self, endpoint: str, cost: LearnedCost, prefill_tokens_per_s: float) -> None:
        self.costs.append((endpoint, cost, prefill_tokens_per_s))


def learning(enabled: bool = True, **over: float | str) -> CostLearning:
    knobs = {"learning_rate": 0.3, "max_base_s": 0.5, "max_scale": 4.0, "max_interference_per_running": 0.1,
             "pooled_share": 0.0, "learner": "nlms", "forgetting": 0.995}  # fmt: skip
    knobs.update(over)
    return CostLearning(learn=enabled, prior=PRIOR, prefill_tokens_per_s=10_000.0, **knobs)  # type: ignore[arg-type]


def measuring(sink: Sink) -> TtftCalibration:
    return TtftCalibration(sink, learning(enabled=False))


def test_the_config_defaults_build_the_learning_settings() -> None:
    got = cost_learning(SchedulingConfig())
    # The prior's fixed cost is the configured per-request overhead: a request pays its own turn too.
    assert got.learn and got.prior.base_s == TtftProfileConfig().request_overhead_s and got.prior.prefill_scale == 1.0
    assert got.prefill_tokens_per_s == SchedulingConfig().prefill_tokens_per_s
    assert got.learner == "rls"  # NLMS drifted on heavy-tailed intervals (bench/results/rls-learner, rls-default)


def test_an_interval_compares_mean_predicted_with_the_engines_mean() -> None:
    sink = Sink()
    cal = measuring(sink)
    cal.observe(A, PhaseTotals(seconds=10.0, requests=100))  # first sight: the baseline, no interval
    cal.predicted(A, 0.2)
    cal.predicted(A, 0.4)
    cal.observe(A, PhaseTotals(seconds=10.0, requests=100))  # nothing finished yet: keep accumulating
    assert sink.seen == []
    cal.observe(A, PhaseTotals(seconds=10.9, requests=103))  # 3 first tokens, 0.3 s each
    [(endpoint, predicted, actual, ratio)] = sink.seen
    assert (endpoint, predicted, actual) == (A, pytest.approx(0.3), pytest.approx(0.3))
    assert ratio == pytest.approx(1.0)
    assert cal.cost(A) is None  # measure-only: nothing learned


def test_first_tokens_pair_with_the_oldest_open_predictions() -> None:
    """A cold prefill routed before a warm request finishes two scrapes later, after the warm one was routed:
    each first token is compared with its own prediction, not with the mean of what was routed meanwhile."""
    sink = Sink()
    cal = measuring(sink)
    cal.observe(A, PhaseTotals(0.0, 0))
    cal.predicted(A, 0.3)  # cold
    cal.observe(A, PhaseTotals(0.0, 0))  # still prefilling
    cal.predicted(A, 0.05)  # warm, queued behind it
    cal.observe(A, PhaseTotals(0.3, 1))  # the cold one's first token
    cal.observe(A, PhaseTotals(0.3 + 0.06, 2))  # the warm one's
    assert [(p, a) for _, p, a, _ in sink.seen] == [(0.3, pytest.approx(0.3)), (0.05, pytest.approx(0.06))]


def test_another_replicas_predictions_take_their_place_in_the_pairing() -> None:
    """Two replicas route to one engine: this one a warm request (0.05 s), the other a cold one (0.4 s) just
    after. Without the other's prediction the engine's first of two first tokens, the warm one, would pair with
    ours and its second, the cold one, with nothing; heard, each first token pairs with its own request."""
    sink, told = Sink(), list[Prediction]()
    cal = TtftCalibration(sink, learning(enabled=False), on_predicted=told.append)
    cal.observe(A, PhaseTotals(0.0, 0))
    cal.predicted(A, 0.05, (1.0, 0.01, 0.0, 0.0), 0.001)
    cal.heard(Prediction(A, 0.4, (1.0, 0.3, 0.0, 0.0), 0.0))
    cal.observe(A, PhaseTotals(0.06, 1))  # ours
    cal.observe(A, PhaseTotals(0.06 + 0.42, 2))  # theirs
    assert [(p, a) for _, p, a, _ in sink.seen] == [(0.05, pytest.approx(0.06)), (0.4, pytest.approx(0.42))]
    assert told == [Prediction(A, 0.05, (1.0, 0.01, 0.0, 0.0), 0.001)], "only our own predictions are told"


def test_another_replicas_predictions_teach_as_ours_do() -> None:
    """Heard predictions carry their terms: an engine whose every request came from the other replica is learned
    exactly as if this replica had routed them."""
    ours, theirs = TtftCalibration(Sink(), learning()), TtftCalibration(Sink(), learning())
    for cal in (ours, theirs):
        cal.observe(A, PhaseTotals(0.0, 0))
    seconds = 0.0
    for i in range(30):
        features = (1.0, 0.1 + 0.01 * (i % 5), 0.0, 0.0)
        ours.predicted(A, 0.2, features, 0.0)
        theirs.heard(Prediction(A, 0.2, features, 0.0))
        seconds += 2.0 * features[1]  # the engine prefills at half the configured rate
        for cal in (ours, theirs):
            cal.observe(A, PhaseTotals(seconds, i + 1))
    assert theirs.cost(A) == ours.cost(A) != PRIOR


def test_an_engine_counting_more_than_was_routed_pairs_what_is_open() -> None:
    sink = Sink()
    cal = measuring(sink)
    cal.observe(A, PhaseTotals(0.0, 0))
    cal.predicted(A, 0.2)
    cal.observe(A, PhaseTotals(0.8, 4))  # three more first tokens than we routed: another router's
    cal.observe(A, PhaseTotals(1.0, 5))  # nothing open: no interval
    assert [(p, a) for _, p, a, _ in sink.seen] == [(0.2, pytest.approx(0.2))]


def test_a_prediction_never_counted_is_dropped_after_a_while() -> None:
    now = [0.0]
    sink = Sink()
    cal = TtftCalibration(sink, learning(enabled=False), clock=lambda: now[0])
    cal.observe(A, PhaseTotals(0.0, 0))
    cal.predicted(A, 5.0)  # aborted: the engine never counts its first token
    now[0] = ABANDONED_S + 1
    cal.predicted(A, 0.1)
    cal.observe(A, PhaseTotals(0.1, 1))
    assert [(p, a) for _, p, a, _ in sink.seen] == [(0.1, pytest.approx(0.1))]  # not paired with the aborted one


def test_the_ratio_follows_an_estimate_that_is_too_low() -> None:
    sink = Sink()
    cal = measuring(sink)
    cal.observe(A, PhaseTotals(0.0, 0))
    for i in range(1, 60):
        cal.predicted(A, 0.1)
        cal.observe(A, PhaseTotals(0.2 * i, i))  # each request really took 0.2 s
    assert cal.ratio(A) == pytest.approx(2.0, rel=0.01)
    assert cal.ratio(EndpointId("unseen:1")) == 1.0


@pytest.mark.parametrize("totals", [None, PhaseTotals(1.0, 1)], ids=["no-histogram", "engine-restarted"])
def test_no_histogram_or_a_restart_yields_no_interval(totals: PhaseTotals | None) -> None:
    sink = Sink()
    cal = measuring(sink)
    cal.observe(A, PhaseTotals(50.0, 100))
    cal.predicted(A, 0.1)
    cal.observe(A, totals)
    assert sink.seen == []


TRUE = LearnedCost(base_s=0.04, prefill_scale=2.0, interference_per_running=0.03, queue_scale=1.5)


def _drive(cal: TtftCalibration, truth: LearnedCost, intervals: int, seed: int = 0, noise: float = 0.0) -> list[float]:
    """Intervals of one request each on A, from varied load; returns each interval's relative error of the
    prediction made with what was learned so far (what ``router_ttft_error_ratio`` observes)."""
    rng = random.Random(seed)
    total_s, errors = 0.0, []
    cal.observe(A, PhaseTotals(0.0, 0))
    for i in range(1, intervals + 1):
        terms = CostTerms(work_s=rng.uniform(0.01, 0.2), running=rng.randint(0, 16), queue_s=rng.uniform(0, 0.05),
                          fixed_s=0.0)  # fmt: skip
        predicted = ttft_s(terms, cal.cost(A) or PRIOR)
        actual = ttft_s(terms, truth) * (1 + rng.uniform(-noise, noise))
        errors.append(abs(predicted - actual) / actual)
        cal.predicted(A, predicted, terms.features(), terms.fixed_s)
        total_s += actual
        cal.observe(A, PhaseTotals(total_s, i))
    return errors


LEARNERS = pytest.mark.parametrize("learner", ["nlms", "rls"])


@LEARNERS
def test_learning_brings_the_estimate_within_15_percent_of_what_happened(learner: str) -> None:
    sink = Sink()
    cal = TtftCalibration(sink, learning(learner=learner))
    errors = _drive(cal, TRUE, 300)
    assert errors[0] > 0.4  # the configured estimate starts ~2x too low
    assert sorted(errors[-100:])[50] < 0.15  # median error of the last 100 intervals
    endpoint, cost, rate = sink.costs[-1]
    assert endpoint == A and rate == pytest.approx(10_000.0 / cost.prefill_scale)


@LEARNERS
def test_noise_moves_the_learned_model_little(learner: str) -> None:
    cal = TtftCalibration(Sink(), learning(learner=learner))
    errors = _drive(cal, TRUE, 300, seed=1, noise=0.3)  # each interval +-30%: the median stays near the truth
    assert sorted(errors[-100:])[50] < 0.25


@pytest.mark.parametrize(
    ("truth", "check"),
    [
        # 50x slower than configured: as far as the bounds allow (NLMS: at both of them; RLS: the relative samples
        # of an engine far past them say "slower" mostly through the prefill rate, and the fixed cost takes the rest)
        (
            LearnedCost(5.0, 50.0, 1.0, 50.0),
            lambda c, learner: (c.base_s == 0.5 and c.prefill_scale == 4.0) if learner == "nlms"
            else c.prefill_scale >= 3.5,
        ),
        (LearnedCost(0.0, 0.01, 0.0, 0.01), lambda c, _: c.prefill_scale == 0.25 and c.queue_scale <= 0.26),
    ],
    ids=["wildly-slow", "wildly-fast"],
)  # fmt: skip
@LEARNERS
def test_learned_weights_stay_within_their_bounds(truth: LearnedCost, check, learner: str) -> None:  # type: ignore[no-untyped-def]
    cal = TtftCalibration(Sink(), learning(learner=learner))
    _drive(cal, truth, 400)
    cost = cal.cost(A)
    assert cost is not None and check(cost, learner), cost
    assert 0 <= cost.base_s <= 0.5 and 0.25 <= cost.prefill_scale <= 4.0 and 0.25 <= cost.queue_scale <= 4.0
    assert 0 <= cost.interference_per_running <= 0.1 + 1e-9


@pytest.mark.parametrize(
    "truth",
    [LearnedCost(0.2, 4.0, 0.005, 4.0), LearnedCost(0.0, 0.25, 0.004, 0.25), LearnedCost(0.01, 0.3, 0.01, 0.5)],
    ids=["4x-slower", "4x-faster", "mixed"],
)
def test_rls_learns_an_engine_up_to_the_bounds_away_from_the_configured_one(truth: LearnedCost) -> None:
    """The prior scales with the weights, so the relative samples of a slow engine outweigh it as fast as a fast
    engine's do (with the configured spans as the prior, 4x faster stayed at 45% error after 600 intervals)."""
    cal = TtftCalibration(Sink(), learning(learner="rls"))
    errors = _drive(cal, truth, 300, seed=2)
    assert sorted(errors[-100:])[50] < 0.1


def _shared_steps(cal: TtftCalibration, intervals: int, seed: int) -> tuple[list[float], list[float]]:
    """Mooncake at 16 req/s in miniature: the engine follows ``COUNTED`` but one interval in eight is a short
    prompt that shared its step with a long one routed just after it, so it took 2-5x its terms, and more so
    the larger the decode batch (busier engines get more arrivals). Returns the relative error of each ordinary
    interval's prediction, and each learned interference."""
    rng = random.Random(seed)
    total_s, errors, interference = 0.0, [], []
    cal.observe(A, PhaseTotals(0.0, 0))
    for i in range(1, intervals + 1):
        running = rng.randint(0, 20)
        shared = rng.random() < 0.125 * (0.5 + running / 20)
        work = rng.uniform(0.005, 0.03) if shared else rng.uniform(0.01, 0.3)
        terms = CostTerms(work_s=work, running=running, queue_s=rng.uniform(0, 0.1), fixed_s=0.0)
        predicted = ttft_s(terms, cal.cost(A) or COUNTED)
        actual = ttft_s(terms, COUNTED) * (rng.uniform(2, 5) if shared else rng.uniform(0.9, 1.1))
        if not shared:
            errors.append(abs(predicted - actual) / actual)
        cal.predicted(A, predicted, terms.features(), 0.0)
        total_s += actual
        cal.observe(A, PhaseTotals(total_s, i))
        cost = cal.cost(A)
        interference.append(cost.interference_per_running if cost else COUNTED.interference_per_running)
    return errors, interference


COUNTED = LearnedCost(base_s=0.05, prefill_scale=1.0, interference_per_running=0.01, queue_scale=1.0)


def test_rls_keeps_short_prompts_that_shared_a_step_off_the_interference() -> None:
    """What NLMS did on mooncake at 16 req/s (bench/results/rls-learner): those intervals are the largest in
    seconds where work x running is largest, so its steps put them on the interference weight (here 0.01 ->
    ~0.05) and every ordinary request with a large batch was then priced high. RLS on relative errors with
    Huber's weights keeps the weight near the engine's and the ordinary requests' estimate within 15%."""
    cal = TtftCalibration(Sink(), learning(learner="rls"))
    errors, interference = _shared_steps(cal, 600, seed=4)
    assert max(interference[-300:]) < 0.02
    assert sorted(errors[-200:])[100] < 0.15


def test_an_untaught_endpoint_gets_the_mean_of_the_taught_ones() -> None:
    cal = TtftCalibration(Sink(), learning())
    assert cal.cost(B) is None
    _drive(cal, TRUE, 50)
    assert cal.cost(B) == cal.cost(A)
    cal.forget(A)
    assert cal.cost(B) is None


def test_the_fleets_mean_is_that_of_the_latest_weights() -> None:
    """The pooled mean is kept between decisions (each asks every candidate's cost), never past a step."""
    own, pooled = (
        TtftCalibration(Sink(), learning(pooled_share=0.0)),
        TtftCalibration(Sink(), learning(pooled_share=1.0)),
    )
    for intervals in (1, 5, 20):
        _drive(own, TRUE, intervals)
        _drive(pooled, TRUE, intervals)
        assert pooled.cost(A) == own.cost(A)  # one taught endpoint: the mean is its own latest weights


def _two_taught(share: float) -> tuple[LearnedCost, LearnedCost]:
    """A taught by 100 intervals of ``TRUE``, B by one interval of a cheaper engine; their costs at ``share``."""
    cal = TtftCalibration(Sink(), learning(pooled_share=share))
    _drive(cal, TRUE, 100)
    cal.observe(B, PhaseTotals(0.0, 0))
    cal.predicted(B, 0.1, CostTerms(work_s=0.1, running=0, queue_s=0.0, fixed_s=0.0).features(), 0.0)
    cal.observe(B, PhaseTotals(0.05, 1))
    a, b = cal.cost(A), cal.cost(B)
    assert a is not None and b is not None
    return a, b


def test_pooled_share_blends_each_endpoints_weights_with_the_fleets_mean() -> None:
    def gap(share: float) -> float:
        a, b = _two_taught(share)
        return abs(a.prefill_scale - b.prefill_scale)

    assert gap(0.0) > 0.1  # each its own
    assert gap(0.5) == pytest.approx(gap(0.0) / 2)
    assert gap(1.0) == pytest.approx(0.0)  # one cost model for the fleet


def test_learning_off_never_teaches() -> None:
    cal = TtftCalibration(Sink(), learning(enabled=False))
    _drive(cal, TRUE, 50)
    assert cal.cost(A) is None


@LEARNERS
def test_one_short_prompt_teaches_the_fixed_cost_not_the_prefill_rate(learner: str) -> None:
    """An 11-token request (work 1.1 ms) that took 50 ms: its error is the fixed cost's; before the mean-square
    floor that one interval put the prefill scale at its 4x bound, and the next long prompt was priced 4x."""
    cal = TtftCalibration(Sink(), learning(learner=learner))
    cal.observe(A, PhaseTotals(0.0, 0))
    terms = CostTerms(work_s=11 / 10_000, running=0, queue_s=0.0, fixed_s=0.0)
    cal.predicted(A, ttft_s(terms, PRIOR), terms.features(), 0.0)
    cal.observe(A, PhaseTotals(0.05, 1))
    cost = cal.cost(A)
    assert cost is not None and cost.base_s > 0
    assert 0.9 < cost.prefill_scale < 1.1, cost
