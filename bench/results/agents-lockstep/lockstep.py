"""Summarise cell traces (``python -m bench.cell_trace``) of the agents workload: where the TTFT tail came from.

    python bench/results/agents-lockstep/lockstep.py TRACE.jsonl...

Per trace: client TTFT p50 / p90, the requests that waited more than 45 ms in the engine's queue (more than one
decode step: another request's prefill step was running), the requests that reached their engine less than
0.1 s after another one did (the lockstep pairs of docs/scheduling.md), cold requests (less than 60% cached),
the picker's moves of a call that continues a chain (not its first call), the reasons, and requests per backend.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from typing import Any


def summary(rows: list[dict[str, Any]]) -> str:
    ttft = [r["ttft_s"] for r in rows]
    waited = sum(1 for r in rows if (r.get("model_queue_s") or 0) > 0.045)
    beside = sum(
        1
        for r in rows
        if any(
            o is not r and o["backend"] == r["backend"] and 0 <= r["engine_arrival_s"] - o["engine_arrival_s"] < 0.1
            for o in rows
        )
    )
    cold = sum(1 for r in rows if r["cached_tokens"] <= 0.6 * r["prompt_tokens"])
    mid_moves = sum(1 for r in rows if r.get("reason") == "move" and not r["rid"].endswith("-0"))
    reasons = dict(Counter(r.get("reason") for r in rows))
    spread = sorted(Counter(r["backend"] for r in rows).values())
    return (
        f"p50 {statistics.median(ttft):.3f} p90 {statistics.quantiles(ttft, n=10)[-1]:.3f}  "
        f"queued>45ms {waited:2d}  arrived<0.1s-after-another {beside:2d}  cold {cold}  "
        f"mid-chain moves {mid_moves}  {reasons} {spread}"
    )


def main(paths: list[str]) -> None:
    for path in paths:
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        print(f"{path}: {summary(rows)}")


if __name__ == "__main__":
    main(sys.argv[1:])
