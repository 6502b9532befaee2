"""Summaries of traces.sh's traces of tenants at 8 req/s.

    python summary.py table OUT [A B]      # per trace, then each side's medians (table.txt; sides rls, nlms)
    python summary.py slow TRACE.jsonl     # slow requests: cold, and warm ones behind a cold prefill
    python summary.py early TRACE.jsonl    # the first 30 requests, with the estimates per backend

A request is slow past 0.25 s (the cell's warm requests take ~0.08-0.2 s, a cold prefill ~0.33 s); cold: less
than half its prompt cached; behind a cold prefill: a cold one went to its backend at most 0.4 s before it.
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shared-busy"))
from balanced import permutation_p  # the same test as the alternated cells'

SLOW_S = 0.25
SLOW_MODE_P90_S = 0.22


def rows_of(trace: Path) -> list[dict[str, Any]]:
    with trace.open() as f:
        rows = [json.loads(line) for line in f]
    return sorted((r for r in rows if r.get("ok")), key=lambda r: r["start_s"])


def is_cold(r: dict[str, Any]) -> bool:
    return bool(r["cached_tokens"] < r["prompt_tokens"] / 2)


def slow(trace: Path) -> str:
    rows = rows_of(trace)
    cold = [r for r in rows if is_cold(r)]
    late = [r for r in rows if r["ttft_s"] > SLOW_S]
    warm = [r for r in late if not is_cold(r)]
    behind = sum(
        any(c["backend"] == w["backend"] and 0 <= w["start_s"] - c["start_s"] < 0.4 for c in cold) for w in warm
    )
    reasons = dict(collections.Counter(r.get("reason") for r in rows))
    return (
        f"{trace}: slow {len(late)} (cold {len(late) - len(warm)}, warm {len(warm)}, of them behind a cold prefill "
        f"{behind}); cold prefills {len(cold)}, the last at {max(c['start_s'] for c in cold):.1f} s; {reasons}"
    )


def early(trace: Path, n: int = 30) -> str:
    rows = rows_of(trace)
    names = sorted({r["backend"] for r in rows})
    index = {b: i for i, b in enumerate(names)}
    out = [f"{trace} (time s, request, reason -> backend, cached / prompt tokens, TTFT, predicted | each estimate)"]
    for r in rows[:n]:
        est = " ".join(f"{r['estimates_s'].get(b, float('nan')):.3f}" for b in names)
        out.append(
            f"  {r['start_s']:6.2f} {r['rid']:10} {r['reason'] or '-':5} -> {index[r['backend']]} "
            f"cached {r['cached_tokens']:5}/{r['prompt_tokens']:5} ttft {r['ttft_s']:.3f} "
            f"pred {r['estimates_s'].get(r['backend'], float('nan')):.3f} | {est}"
        )
    return "\n".join(out)


def table(out: Path, sides: tuple[str, str] = ("rls", "nlms")) -> str:
    lines, runs = [], collections.defaultdict(list)
    for log in sorted(out.glob("*-*.log"), key=lambda p: (p.stem.split("-")[0], int(p.stem.split("-")[1]))):
        found = re.search(r"p90 ttft ([0-9.]+)", log.read_text())
        if not found:
            continue
        rows = rows_of(next((out / log.stem).glob("trace-*.jsonl")))
        p90 = float(found.group(1))
        late = sum(r["ttft_s"] > SLOW_S for r in rows)
        mean = statistics.mean(r["ttft_s"] for r in rows)
        reasons = dict(collections.Counter(r.get("reason") for r in rows))
        runs[log.stem.split("-")[0]].append((p90, late, mean))
        cold = sum(map(is_cold, rows))
        lines.append(f"{log.stem:8} p90 {p90:.3f} slow {late:3} cold {cold:3} mean {mean:.4f} {reasons}")
    one, other = runs[sides[0]], runs[sides[1]]
    for i, label in [(0, "p90"), (1, "slow"), (2, "mean")]:
        a, b = [x[i] for x in one], [x[i] for x in other]
        lines.append(
            f"{label}: {sides[0]} median {statistics.median(a):.4f} (n {len(a)}), {sides[1]} "
            f"{statistics.median(b):.4f} (n {len(b)}), permutation p {permutation_p(a, b):.2f}"
        )
    modes = []
    for side, side_runs in zip(sides, (one, other), strict=True):
        modes.append(f"{sum(x[0] > SLOW_MODE_P90_S for x in side_runs)} of {len(side_runs)} {side}")
    lines.append(f"slow mode (p90 > {SLOW_MODE_P90_S} s): " + ", ".join(modes))
    return "\n".join(lines)


if __name__ == "__main__":
    command, *paths = sys.argv[1:]
    if command == "table":
        print(table(Path(paths[0]), (paths[1], paths[2]) if len(paths) == 3 else ("rls", "nlms")))
    else:
        print("\n".join((slow if command == "slow" else early)(Path(p)) for p in paths))
