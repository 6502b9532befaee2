"""Where agents' lockstep pairs are in cell traces (``python -m bench.cell_trace --workload agents``): each request
that waited more than one decode step (45 ms) in its engine's queue, the requests that reached its backend less
than 0.1 s before it, and the picker's estimates for it (the last 5 characters of each backend's address).

    python bench/results/chain-starts/pairs.py TRACE.jsonl...
"""

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    for path in paths:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        rows.sort(key=lambda r: r["engine_arrival_s"])
        t0 = rows[0]["engine_arrival_s"]
        slow = [r for r in rows if (r.get("model_queue_s") or 0) > 0.045]
        print(path, "slow", len(slow))
        for r in slow:
            beside = [
                (o["rid"][6:], round(r["engine_arrival_s"] - o["engine_arrival_s"], 3))
                for o in rows
                if o is not r
                and o["backend"] == r["backend"]
                and 0 <= r["engine_arrival_s"] - o["engine_arrival_s"] < 0.1
            ]
            est = ", ".join(f"{k[-5:]}:{v:.3f}" for k, v in (r.get("estimates_s") or {}).items())
            print(
                f"  {r['engine_arrival_s'] - t0:6.3f} {r['rid'][6:]:>8} {r['backend'][-5:]} {r.get('reason')} "
                f"q{r['model_queue_s']:.3f} beside {beside} est {{{est}}}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
