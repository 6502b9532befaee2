"""The TTFT estimate's error three ways, from cell traces (``python -m bench.cell_trace``): per request (the
simulator's model TTFT against the pick's estimate), and per endpoint and 100 ms scrape interval as the
calibration computed it before stop 31 (what was routed in the interval against what finished in it) and after
(each interval's first tokens paired with the oldest open predictions). Engine times only: no scrape lag.

    python bench/results/fifo-calibration/pairing.py TRACE.jsonl ...
"""

import json
import sys
from collections import defaultdict

SCRAPE_S = 0.1


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def errors(rows: list[dict]) -> tuple[list[float], list[float], list[float]]:
    per_request, routed_vs_done, paired = [], [], []
    t0 = min(r["engine_arrival_s"] for r in rows)
    by_backend: dict[str, list[tuple[float, float, float]]] = defaultdict(list)  # (arrival, predicted, actual)
    for r in rows:
        predicted, actual = r["estimates_s"][r["picked"]], r["model_ttft_s"]
        per_request.append(abs(predicted - actual) / actual)
        by_backend[r["backend"]].append((r["engine_arrival_s"] - t0, predicted, actual))
    for reqs in by_backend.values():
        reqs.sort()
        end = max(a + t for a, _, t in reqs) + SCRAPE_S
        routed_sum = routed_n = 0.0
        next_routed = 0
        open_preds: list[float] = []
        scrape, last = SCRAPE_S, 0.0
        while scrape <= end:
            while next_routed < len(reqs) and reqs[next_routed][0] < scrape:
                routed_sum += reqs[next_routed][1]
                routed_n += 1
                open_preds.append(reqs[next_routed][1])
                next_routed += 1
            done = [t for a, _, t in reqs if last <= a + t < scrape]
            if done:
                actual = sum(done) / len(done)
                if routed_n:
                    routed_vs_done.append(abs(routed_sum / routed_n - actual) / actual)
                routed_sum = routed_n = 0.0
                matched, open_preds = open_preds[: len(done)], open_preds[len(done) :]
                if matched:
                    paired.append(abs(sum(matched) / len(matched) - actual) / actual)
                last = scrape
            scrape += SCRAPE_S
    return per_request, routed_vs_done, paired


def main(paths: list[str]) -> None:
    print(f"{'trace':40s} {'per request p50/p90':>20s} {'routed vs done p50/p90':>24s} {'paired p50/p90':>16s}")
    for path in paths:
        with open(path) as lines:
            rows = [json.loads(line) for line in lines]
        rows = [r for r in rows if r.get("ok") and r.get("model_ttft_s") and r["picked"] in r.get("estimates_s", {})]
        cols = [f"{quantile(e, 0.5):.3f} / {quantile(e, 0.9):.3f} ({len(e)})" for e in errors(rows)]
        print(f"{path.split('/')[-1]:40s} {cols[0]:>20s} {cols[1]:>24s} {cols[2]:>16s}")


if __name__ == "__main__":
    main(sys.argv[1:])
