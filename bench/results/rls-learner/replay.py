"""Replay the calibration's learners on what stop 43's mooncake traces priced each request on.

    python bench/results/rls-learner/replay.py bench/results/learned-drift/terms-*.txt

Input: ``learned-drift/terms.py``'s table (per request, in arrival order: endpoint, uncached tokens, the
prediction, the simulator's TTFT, the estimate's terms). Each request is routed at its arrival with the
estimate of the learner's cost model so far (``TtftCalibration.cost``, pooled as the picker pools), and counted
by its engine at its first token (one interval per request, paired oldest first as the picker pairs). Printed per
learner: the per-request relative error's p50 (all, second half) and signed p50, and the last learned cost.
The terms are the traced picker's, so the load each request met is what that picker's placements made; only the
prices are replayed.
"""

import re
import statistics
import sys

from extproc.backends.calibration import CostLearning, TtftCalibration
from extproc.backends.vllm_metrics import PhaseTotals
from extproc.scheduling.estimate import CostTerms, ttft_s
from extproc.types import EndpointId, LearnedCost

PRIOR = LearnedCost(base_s=0.05, prefill_scale=1.0, interference_per_running=0.004, queue_scale=1.0)  # the bench's
_ROW = re.compile(
    r"\s*([\d.]+) (\d+)\s+(\d+) [\d.]+\s+\d+ \| ([\d.]+) ([\d.]+)\s+[+-][\d.]+ \| ([\d.]+) [\d.]+\s+(\d+) ([\d.]+)"
)


class _Quiet:
    def interval(self, *_: object) -> None: ...

    def learned(self, *_: object) -> None: ...


def rows_of(path: str) -> list[dict]:
    rows = []
    with open(path) as lines:
        for line in lines:
            m = _ROW.match(line)
            if m:
                t, ep, _unc, _pred, act, work, running, queue = m.groups()
                rows.append({"t": float(t), "ep": EndpointId(ep), "act": float(act), "work": float(work),
                             "running": int(running), "queue": float(queue)})  # fmt: skip
    return rows


def replay(rows: list[dict], learner: str) -> tuple[float, float, float, LearnedCost | None]:
    # the config's defaults:
    learning = CostLearning(
        learn=True, learning_rate=0.3, max_base_s=0.5, max_scale=4.0, max_interference_per_running=0.1,
        pooled_share=1.0, prior=PRIOR, prefill_tokens_per_s=30_800.0, learner=learner, forgetting=0.995,
    )  # fmt: skip
    cal = TtftCalibration(_Quiet(), learning)
    counted: dict[EndpointId, list[float]] = {}
    for r in rows:
        if r["ep"] not in counted:
            counted[r["ep"]] = [0.0, 0]
            cal.observe(r["ep"], PhaseTotals(0.0, 0))
    arrivals = [(r["t"], 0, i) for i, r in enumerate(rows)]
    events = sorted(arrivals + [(r["t"] + r["act"], 1, i) for i, r in enumerate(rows)])  # 1: its first token
    errors: dict[int, float] = {}
    for _, kind, i in events:
        r = rows[i]
        terms = CostTerms(work_s=r["work"], running=r["running"], queue_s=r["queue"], fixed_s=0.0)
        if kind == 0:
            predicted = ttft_s(terms, cal.cost(r["ep"]) or PRIOR)
            errors[i] = (predicted - r["act"]) / r["act"]
            cal.predicted(r["ep"], predicted, terms.features(), 0.0)
        else:
            total = counted[r["ep"]]
            total[0] += r["act"]
            total[1] += 1
            cal.observe(r["ep"], PhaseTotals(total[0], int(total[1])))
    ordered = [errors[i] for i in range(len(rows))]
    absolute = [abs(e) for e in ordered]
    half = absolute[len(absolute) // 2 :]
    return statistics.median(absolute), statistics.median(half), statistics.median(ordered), cal.cost(rows[0]["ep"])


def main(paths: list[str]) -> None:
    print("trace | learner | abs p50 | second half | signed p50 | last cost (base, scale, interference, queue)")
    for path in paths:
        rows = rows_of(path)
        for learner in ("nlms", "rls"):
            full, half, signed, cost = replay(rows, learner)
            c = "-" if cost is None else f"{cost.base_s:.3f}, {cost.prefill_scale:.3f}, " \
                f"{cost.interference_per_running:.4f}, {cost.queue_scale:.2f}"  # fmt: skip
            print(f"{path.rsplit('/', 1)[-1]} | {learner} | {full:.3f} | {half:.3f} | {signed:+.3f} | {c}")


if __name__ == "__main__":
    main(sys.argv[1:])
