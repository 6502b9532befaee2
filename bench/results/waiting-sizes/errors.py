"""The picked endpoint's TTFT estimate against the engine's own TTFT, per request, from ``bench.cell_trace`` traces.

    python bench/results/waiting-sizes/errors.py TRACE.jsonl [TRACE.jsonl ...]

Per trace: TTFT p50/p90 (client), then the error (estimate - engine TTFT) / engine TTFT over all requests and
split into warm (more than half the prompt cached) and cold: its absolute p50/p90, and actual / estimate p90.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def errors(rows: list[dict[str, object]]) -> str:
    est = [float(r["estimates_s"][r["picked"]]) for r in rows]  # type: ignore[index]
    actual = [float(r["model_ttft_s"]) for r in rows]  # type: ignore[arg-type]
    rel = [abs(e - a) / a for e, a in zip(est, actual, strict=True)]
    over = [a / e for e, a in zip(est, actual, strict=True)]
    return (f"n {len(rows):3d} |err| p50 {quantile(rel, 0.5):.3f} p90 {quantile(rel, 0.9):.3f} "
            f"actual/est p90 {quantile(over, 0.9):.2f}")  # fmt: skip


def usable(row: dict[str, object]) -> bool:
    """Served, with the engine's TTFT and an estimate for the endpoint picked."""
    return bool(row.get("ok") and row.get("model_ttft_s")) and row.get("picked") in (row.get("estimates_s") or {})  # type: ignore[operator]


def summarize(path: Path) -> None:
    with path.open() as lines:
        rows = [json.loads(line) for line in lines]
    rows = [r for r in rows if usable(r)]
    ttft = [r["ttft_s"] for r in rows]
    warm = [r for r in rows if r["cached_tokens"] * 2 > r["prompt_tokens"]]
    cold = [r for r in rows if r["cached_tokens"] * 2 <= r["prompt_tokens"]]
    print(f"{path.parent.name}/{path.name}: ttft p50 {quantile(ttft, 0.5):.4f} p90 {quantile(ttft, 0.9):.4f}")
    for label, part in (("all", rows), ("warm", warm), ("cold", cold)):
        if part:
            print(f"    {label:4s} {errors(part)}")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        summarize(Path(arg))
