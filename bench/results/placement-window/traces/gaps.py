"""Cold placements (reason ``load``) that did not take the best estimate, from a ``bench.cell_trace`` trace.

    python bench/results/placement-window/traces/gaps.py TRACE.jsonl

Prints how many ``load`` decisions there were, how many picked an endpoint more than 10 ms above the best
estimate, and those gaps with the request's TTFT, largest first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GAP_S = 0.011  # above the suite's tie_epsilon_s (2 ms x the simulator's time scale 5)


def main(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    cold = [r for r in rows if r.get("reason") == "load" and r.get("estimates_s")]
    gaps = []
    for r in cold:
        est = r["estimates_s"]
        gap = est[r["picked"]] - min(est.values())
        if gap > GAP_S:
            gaps.append((round(gap, 3), round(r["ttft_s"], 3), r["prompt_tokens"]))
    print(f"load decisions {len(cold)}, not the best estimate (>10 ms) {len(gaps)}")
    print("(gap s, ttft s, prompt tokens):", sorted(gaps, reverse=True))


if __name__ == "__main__":
    main(sys.argv[1])
