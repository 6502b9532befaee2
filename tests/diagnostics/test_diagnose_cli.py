"""``extproc diagnose`` on small generated JSONL files, tokenized with Qwen3's real tokenizer and template."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from extproc.cli import main

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen3-0.6B"
SYSTEM = (
    "You are a careful support assistant for the Acme cloud platform. Answer briefly, cite the documentation "
    "section you used, never invent features, and ask a clarifying question when a request is ambiguous. "
) * 6
QUESTIONS = ["How do I rotate my API key?", "Why is my bill higher this month?", "Can I move a VM to another region?"]


def _write(path: Path, *, stamp: bool, n: int = 16) -> Path:
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(n):
            t = f"2026-12-02T{rng.randrange(24):02d}:{rng.randrange(60):02d}:{rng.randrange(60):02d}Z"
            system = (f"Current time: {t}. " if stamp else "") + SYSTEM
            body = {"model": MODEL, "messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": QUESTIONS[i % 3]}]}  # fmt: skip
            f.write(json.dumps({"body": body, "tenant": "gold"} if i % 2 else body) + "\n")
    return path


def _diagnose(path: Path, tmp_path: Path, *extra: str) -> tuple[str, Path]:
    plot = tmp_path / "plot.svg"
    args = [str(path), "--tokenizer-cache", str(ROOT / "tokenizer_cache"), "--plot", str(plot), *extra]
    assert main(["diagnose", *args]) == 0
    return plot.read_text(), plot


def test_a_timestamp_at_the_top_of_the_system_prompt_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svg, _ = _diagnose(_write(tmp_path / "stamped.jsonl", stamp=True), tmp_path)
    out = capsys.readouterr().out
    assert out.count("varying span in") == 2  # both tenants: the plain bodies ("default") and "gold"
    assert "message 0 (system)" in out and "points lost" in out and "what to do" in out
    assert "Current time" not in out and "2026-12-02T" not in out  # no prompt text without --log-prompts
    offsets = [int(line.split("at token ")[1].split(" ")[0]) for line in out.splitlines() if "at token" in line]
    assert all(5 <= o <= 20 for o in offsets)  # "<|im_start|>system\nCurrent time: 2026-12-02T" is ~14 tokens
    ET.fromstring(svg)
    assert "varying span" in svg


def test_log_prompts_prints_the_span_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _diagnose(_write(tmp_path / "stamped.jsonl", stamp=True), tmp_path, "--log-prompts")
    assert "example span" in capsys.readouterr().out


def test_prompts_without_a_varying_span_report_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, _ = _diagnose(_write(tmp_path / "stable.jsonl", stamp=False), tmp_path)
    out = capsys.readouterr().out
    assert out.count("no varying span") == 2 and "varying span in" not in out
    assert "varying span" not in svg


def test_a_trace_of_chained_block_ids_reports_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Mooncake's format (hash_ids per 512-token block, shared prefixes share ids)."""
    rng = random.Random(1)
    path = tmp_path / "trace.jsonl"
    with path.open("w") as f:
        for i in range(50):
            ids = [0, 1, 2][: rng.randrange(1, 4)] + [100 + 10 * i + k for k in range(rng.randrange(1, 6))]
            f.write(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "hash_ids": ids}) + "\n")
    _diagnose(path, tmp_path)
    out = capsys.readouterr().out
    assert "trace, tenant default: 50 requests diagnosed" in out and "no varying span" in out


def test_unreadable_input_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["diagnose", str(bad), "--plot", ""]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_a_png_plot_with_matplotlib(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")  # the bench extra; SVG needs nothing
    png = tmp_path / "plot.png"
    stamped = _write(tmp_path / "stamped.jsonl", stamp=True)
    args = [str(stamped), "--tokenizer-cache", str(ROOT / "tokenizer_cache"), "--plot", str(png)]
    assert main(["diagnose", *args]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"plot: {png}" in capsys.readouterr().out
