"""The best any fixed weights could have done on stop 43's mooncake traces: least squares on the relative error.

    python bench/results/rls-learner/static_fit.py bench/results/learned-drift/terms-*.txt

Per trace: the per-request relative error's p50 as the picker predicted, then with the weights of the estimate's
own features (1, work, work x running, queue) fitted to the whole trace in hindsight, and with the busy floor's
seconds as a fifth feature. Relative: each request weighs 1 / its TTFT, as the error goal counts it.
"""

import re
import sys

import numpy as np

_ROW = re.compile(
    r"\s*[\d.]+ \d+\s+\d+ [\d.]+\s+\d+ \| ([\d.]+) ([\d.]+)\s+[+-][\d.]+ \| ([\d.]+) [\d.]+\s+(\d+) ([\d.]+) ([\d.]+)"
)


def fit(x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    weights, *_ = np.linalg.lstsq(x / y[:, None], np.ones_like(y), rcond=None)
    return float(np.median(np.abs(x @ weights - y) / y)), weights


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path) as lines:
            rows = [tuple(map(float, m.groups())) for m in map(_ROW.match, lines) if m]
        pred, act, work, running, queue, busy = (np.array(c) for c in zip(*rows, strict=True))
        ones = np.ones_like(act)
        print(f"{path.rsplit('/', 1)[-1]} ({len(rows)} requests)")
        print(f"  as predicted: abs p50 {np.median(np.abs(pred - act) / act):.3f}")
        for name, cols in (("own features", [ones, work, work * running, queue]),
                           ("+ busy floor seconds", [ones, work, work * running, queue, busy])):  # fmt: skip
            p50, weights = fit(np.column_stack(cols), act)
            print(f"  fitted, {name}: abs p50 {p50:.3f}, weights {np.round(weights, 4).tolist()}")


if __name__ == "__main__":
    main(sys.argv[1:])
