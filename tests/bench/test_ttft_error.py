"""The benchmark's TTFT estimate error from the pickers' metrics (``bench.suite.measure.ttft_error``)."""

from bench.suite import measure


def test_a_cells_error_is_the_difference_of_two_readings() -> None:
    before = {"le=0.1": 1.0, "le=0.3": 1.0, "le=+Inf": 1.0, "count": 1.0, "sum": 0.05, "predicted": 1.0, "actual": 1.0}
    after = {"le=0.1": 4.0, "le=0.3": 9.0, "le=+Inf": 11.0, "count": 11.0, "sum": 2.05, "predicted": 3.0,
             "actual": 5.0}  # fmt: skip
    err = measure.ttft_error(before, after)
    # deltas: 3 intervals <= 0.1, 8 <= 0.3, 10 in all; the p90 is past the last finite bound
    assert err is not None
    assert (err["intervals"], err["mape"], err["p50_le"], err["actual_over_predicted"]) == (10.0, 0.2, 0.3, 2.0)
    assert err["p90_le"] is None


def test_no_interval_is_no_error() -> None:
    assert measure.ttft_error({}, {}) is None
