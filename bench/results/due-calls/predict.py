"""How well is a chain's next call predicted: by the chains' running mean time from a call's predicted first token
to the next call, or by the chain's own last such time? From cell traces (each call's send time and its pick's
estimate).

    python bench/results/due-calls/predict.py TRACE.jsonl ...
"""

import json
import sys
from pathlib import Path
from typing import Any


def calls(path: str) -> list[dict[str, Any]]:
    """The trace's calls that carry their pick's estimate, in send order."""
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    rows = [r for r in rows if r.get("estimates_s") and r.get("picked") in r["estimates_s"]]
    return sorted(rows, key=lambda r: r["start_s"])


def quantile_ms(errors: list[float], q: float) -> float:
    return sorted(errors)[int(q * (len(errors) - 1))] * 1000


def errors(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Absolute errors of each predictor on every continuation (the mean's running weight: 0.1, as DueCalls')."""
    last: dict[tuple[str, str], tuple[float, float, float | None]] = {}  # chain -> (sent, estimate, own time)
    mean: float | None = None
    by_mean, by_own = [], []
    for r in rows:
        _, step, session, _ = r["rid"].split("-")
        chain = (step, session)
        own = None
        if chain in last:
            sent, estimate, own_before = last[chain]
            sample = r["start_s"] - (sent + estimate)
            if mean is not None:
                by_mean.append(abs(sample - mean))
                if own_before is not None:
                    by_own.append(abs(sample - own_before))
            mean = sample if mean is None else mean + 0.1 * (sample - mean)
            own = sample
        last[chain] = (r["start_s"], r["estimates_s"][r["picked"]], own)
    return by_mean, by_own


def main(paths: list[str]) -> None:
    for path in paths:
        by_mean, by_own = errors(calls(path))
        print(
            f"{Path(path).name:32s} mean: n {len(by_mean)} p50 {quantile_ms(by_mean, 0.5):5.1f} "
            f"p90 {quantile_ms(by_mean, 0.9):5.1f} ms | own last: n {len(by_own)} "
            f"p50 {quantile_ms(by_own, 0.5):5.1f} p90 {quantile_ms(by_own, 0.9):5.1f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
