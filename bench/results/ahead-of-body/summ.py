"""Summarize ``bench.cell_trace`` folders: TTFT p50/p90, overhead (client TTFT less the engine's), picker_ms.

python bench/results/ahead-of-body/summ.py DIR [DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def summarize(trace: Path) -> str:
    with trace.open() as lines:
        rows = [json.loads(line) for line in lines]
    ttft = [r["ttft_s"] for r in rows]
    overhead = [1000 * (r["ttft_s"] - r["model_ttft_s"]) for r in rows if r.get("model_ttft_s") is not None]
    picker = [r["picker_ms"] for r in rows if r.get("picker_ms") is not None]
    rate = trace.stem.rsplit("-", 1)[-1]
    return (
        f"{trace.parent.name:4s} {rate:>3s} rps: ttft p50 {quantile(ttft, 0.5):.4f} p90 {quantile(ttft, 0.9):.4f} | "
        f"overhead ms p50 {quantile(overhead, 0.5):.2f} p90 {quantile(overhead, 0.9):.2f} | "
        f"picker_ms p50 {quantile(picker, 0.5):.3f} p90 {quantile(picker, 0.9):.3f}"
    )


if __name__ == "__main__":
    for folder in sys.argv[1:]:
        for path in sorted(Path(folder).glob("trace-*.jsonl")):
            print(summarize(path))
