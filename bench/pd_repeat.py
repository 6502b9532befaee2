"""Medians and ranges over repeated ``bench.pd_bench`` runs, and P/D ÷ aggregated ratios taken within each run.

    python -m bench.pd_repeat bench/results/pd-2p2d-repeat/run*/results.json > bench/results/pd-2p2d-repeat/summary.md

Each run is one ``bench.pd_bench`` invocation (its targets side by side on the same box at the same time), so a
ratio is only ever formed inside one run; across runs only the medians and ranges of values and of ratios are
reported.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

METRICS = (
    ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p90_s", "TTFT p90 s"),
    ("tpot_p90_s", "TPOT p90 s"),
    ("itl_p99_s", "ITL p99 s"),
    ("output_tokens_per_s", "out tok/s"),
)
RATIO = ("ours_pd", "ours_aggregated")  # numerator, denominator


def load(paths: list[Path]) -> list[dict[str, dict[str, Any]]]:
    return [{k: v for k, v in json.loads(p.read_text()).items() if not k.startswith("_")} for p in paths]


def spread(values: list[float]) -> str:
    """``median [min-max]``, or ``-`` when no run has the value."""
    if not values:
        return "-"
    digits = 0 if max(values) >= 100 else 3
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def _values(runs: list[dict[str, dict[str, Any]]], key: str, metric: str) -> list[float]:
    return [float(r[key][metric]) for r in runs if key in r and r[key].get(metric) is not None]


def _ratios(runs: list[dict[str, dict[str, Any]]], workload: str, metric: str) -> list[float]:
    num, den = (f"{workload}/{t}" for t in RATIO)
    return [
        float(r[num][metric]) / float(r[den][metric])
        for r in runs
        if num in r and den in r and r[num].get(metric) and r[den].get(metric)
    ]


def report(runs: list[dict[str, dict[str, Any]]]) -> str:
    keys = list(dict.fromkeys(k for r in runs for k in r))
    head = "| workload | target | runs | " + " | ".join(label for _, label in METRICS) + " |"
    rows = [
        f"{len(runs)} runs; each cell: median [min-max] over the runs.",
        "",
        head,
        "|" + "---|" * (3 + len(METRICS)),
    ]
    for key in keys:
        workload, target = key.split("/", 1)
        cells = " | ".join(spread(_values(runs, key, m)) for m, _ in METRICS)
        rows.append(f"| {workload} | {target} | {sum(key in r for r in runs)} | {cells} |")
    rows += ["", f"{RATIO[0]} ÷ {RATIO[1]}, taken within each run: median [min-max] over the runs.", ""]
    rows += ["| workload | " + " | ".join(label for _, label in METRICS) + " |", "|" + "---|" * (1 + len(METRICS))]
    for workload in dict.fromkeys(k.split("/", 1)[0] for k in keys):
        rows.append(f"| {workload} | " + " | ".join(spread(_ratios(runs, workload, m)) for m, _ in METRICS) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    print(report(load(paths)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
