"""Summaries of ``bench.cell_trace`` traces: where each cell's time to first token went.

    python -m bench.trace_summary TRACE.jsonl [TRACE.jsonl ...]
    python -m bench.trace_summary DIR [DIR ...]                # every trace-*.jsonl in each

One line per trace: the client's TTFT (p50, p90); ``overhead``, the client's TTFT less the engine's own (Envoy and
the picker, or a peer router, both HTTP hops, the client); the engine's TTFT (p50, and of warm requests: more
than half the prompt cached); the cold prefills; and for our pickers ``picker_ms``, the decision line's total.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def quantile(values: list[float], share: float) -> float:
    """The ``share`` quantile of ``values`` (nearest rank; NaN when empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def summary(rows: list[dict[str, Any]]) -> str:
    served = [r for r in rows if r.get("ok") and r.get("model_ttft_s") is not None]
    client = [1000 * r["ttft_s"] for r in served]
    overhead = [1000 * (r["ttft_s"] - r["model_ttft_s"]) for r in served]
    engine = [1000 * r["model_ttft_s"] for r in served]
    warm = [1000 * r["model_ttft_s"] for r in served if r["cached_tokens"] * 2 > r["prompt_tokens"]]
    cold = len(served) - len(warm)
    picker = [r["picker_ms"] for r in served if r.get("picker_ms") is not None]
    line = (
        f"client p50 {quantile(client, 0.5):6.1f} p90 {quantile(client, 0.9):6.1f} ms | "
        f"overhead p50 {quantile(overhead, 0.5):5.2f} p90 {quantile(overhead, 0.9):5.2f} ms | "
        f"engine p50 {quantile(engine, 0.5):5.1f} ms, warm {statistics.median(warm) if warm else float('nan'):5.1f} ms"
        f" | cold {cold}"
    )
    if picker:
        line += f" | picker_ms p50 {quantile(picker, 0.5):.3f} p90 {quantile(picker, 0.9):.3f}"
    return line


def traces(args: list[str]) -> list[Path]:
    found: list[Path] = []
    for arg in args:
        path = Path(arg)
        found += sorted(path.glob("trace-*.jsonl")) if path.is_dir() else [path]
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    for path in traces(args):
        with path.open() as lines:
            rows = [json.loads(line) for line in lines]
        print(f"{path.parent.name}/{path.stem}: {summary(rows)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
