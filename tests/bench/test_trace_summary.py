"""``bench.trace_summary``: one line per cell trace, from hand-written rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.trace_summary import main, quantile, summary


def row(ttft_s: float, model_s: float, cached: int, picker_ms: float | None = 1.0) -> dict[str, object]:
    out: dict[str, object] = {"ok": True, "ttft_s": ttft_s, "model_ttft_s": model_s, "prompt_tokens": 100,
                              "cached_tokens": cached}  # fmt: skip
    if picker_ms is not None:
        out["picker_ms"] = picker_ms
    return out


def test_quantile_is_nearest_rank_and_nan_when_empty() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([1.0, 2.0], 0.9) == 2.0
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN


def test_summary_splits_client_time_into_overhead_and_engine() -> None:
    rows = [row(0.070, 0.066, 96), row(0.080, 0.073, 96), row(0.500, 0.494, 0, picker_ms=2.0)]
    rows.append({"ok": False, "ttft_s": None, "model_ttft_s": None})  # failed: left out
    line = summary(rows)
    assert "client p50   80.0" in line and "overhead p50  6.00" in line and "engine p50  73.0" in line
    assert "warm  69.5 ms" in line and "cold 1" in line and "picker_ms p50 1.000" in line


def test_a_peer_trace_has_no_picker_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace-sglang_cache_aware-8.jsonl"
    trace.write_text("\n".join(json.dumps(row(0.07, 0.066, 96, picker_ms=None)) for _ in range(3)) + "\n")
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path.name}/trace-sglang_cache_aware-8: client p50") and "picker_ms" not in out
    assert main([]) == 2
