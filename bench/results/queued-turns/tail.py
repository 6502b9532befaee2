"""Where a cell's TTFT p90 comes from, per cell trace (``python -m bench.cell_trace``):

    python bench/results/queued-turns/tail.py TRACE.jsonl[.gz] [...]

Prints the p90, how many requests are at or above it, how many of those were cold (no cached tokens), in which
second of the cell they arrived and on which backend, then every cold placement (reason ``load``) as (arrival
s, the backend's last five characters).
"""

import gzip
import json
import sys


def main(paths: list[str]) -> None:
    for path in paths:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            rows = sorted((r for r in map(json.loads, f) if r["ok"]), key=lambda r: r["start_s"])
        ttfts = sorted(r["ttft_s"] for r in rows)
        p90 = ttfts[int(0.9 * len(ttfts)) - 1]
        slow = [r for r in rows if r["ttft_s"] >= p90]
        by_second: dict[int, int] = {}
        by_backend: dict[str, int] = {}
        for r in slow:
            by_second[int(r["start_s"])] = by_second.get(int(r["start_s"]), 0) + 1
            by_backend[r["backend"][-5:]] = by_backend.get(r["backend"][-5:], 0) + 1
        cold = sum(1 for r in slow if r["cached_tokens"] == 0)
        print(f"{path.split('/')[-1]} p90 {p90:.3f} slow {len(slow)} cold {cold} by second {by_second} "
              f"by backend {by_backend}")  # fmt: skip
        print("  placements", [(round(r["start_s"], 2), r["backend"][-5:]) for r in rows if r["reason"] == "load"])


if __name__ == "__main__":
    main(sys.argv[1:])
