"""Predicted against actual TTFT per scrape interval (``backends.calibration``)."""

import pytest

from extproc.backends.calibration import TtftCalibration
from extproc.backends.vllm_metrics import PhaseTotals
from extproc.types import EndpointId

A = EndpointId("a:1")


class Intervals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float, float, float]] = []

    def interval(self, endpoint: str, predicted_s: float, actual_s: float, ratio: float) -> None:
        self.seen.append((endpoint, predicted_s, actual_s, ratio))


def test_an_interval_compares_mean_predicted_with_the_engines_mean() -> None:
    sink = Intervals()
    cal = TtftCalibration(sink)
    cal.observe(A, PhaseTotals(seconds=10.0, requests=100))  # first sight: the baseline, no interval
    cal.predicted(A, 0.2)
    cal.predicted(A, 0.4)
    cal.observe(A, PhaseTotals(seconds=10.0, requests=100))  # nothing finished yet: keep accumulating
    assert sink.seen == []
    cal.observe(A, PhaseTotals(seconds=10.9, requests=103))  # 3 first tokens, 0.3 s each
    [(endpoint, predicted, actual, ratio)] = sink.seen
    assert (endpoint, predicted, actual) == (A, pytest.approx(0.3), pytest.approx(0.3))
    assert ratio == pytest.approx(1.0)


def test_the_ratio_follows_an_estimate_that_is_too_low() -> None:
    sink = Intervals()
    cal = TtftCalibration(sink)
    cal.observe(A, PhaseTotals(0.0, 0))
    for i in range(1, 60):
        cal.predicted(A, 0.1)
        cal.observe(A, PhaseTotals(0.2 * i, i))  # each request really took 0.2 s
    assert cal.ratio(A) == pytest.approx(2.0, rel=0.01)
    assert cal.ratio(EndpointId("unseen:1")) == 1.0


@pytest.mark.parametrize("totals", [None, PhaseTotals(1.0, 1)], ids=["no-histogram", "engine-restarted"])
def test_no_histogram_or_a_restart_yields_no_interval(totals: PhaseTotals | None) -> None:
    sink = Intervals()
    cal = TtftCalibration(sink)
    cal.observe(A, PhaseTotals(50.0, 100))
    cal.predicted(A, 0.1)
    cal.observe(A, totals)
    assert sink.seen == []
