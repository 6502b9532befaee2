"""Each agent session's calls in one cell trace, in start order: when, where, why, how long.

    python bench/results/shared-busy/sessions.py traces/one-1.jsonl.gz [...]

Per call: arrival s, ':', the backend's port's last three digits, the reason's first letter (l = load, c = cache,
m = move), '*' when at or above the cell's TTFT p90, then the TTFT in ms.
"""

import gzip
import json
import sys


def main(paths: list[str]) -> None:
    for path in paths:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            rows = sorted((json.loads(line) for line in f), key=lambda r: r["start_s"])
        ttfts = sorted(r["ttft_s"] for r in rows)
        p90 = ttfts[int(0.9 * len(ttfts)) - 1]
        print(path, "p90", round(p90, 3))
        sessions: dict[str, list[dict]] = {}
        for r in rows:
            sessions.setdefault(r["rid"].rsplit("-", 1)[0], []).append(r)
        for name, calls in sessions.items():
            marks = " ".join(
                f"{r['start_s']:.1f}:{r['backend'][-3:]}{r['reason'][0]}{'*' if r['ttft_s'] >= p90 else ''}"
                f"{int(r['ttft_s'] * 1000)}"
                for r in calls
            )
            print(" ", name, marks)


if __name__ == "__main__":
    main(sys.argv[1:])
