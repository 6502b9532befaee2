"""A smoke test of ``python -m bench.route_cost``: every shape is routed (none passes through) and the table
prints with a phase split. The costs are not asserted (this box is shared and noisy)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.stack_config import REPO


@pytest.mark.slow
def test_smoke_run_routes_every_shape_and_prints_its_phases() -> None:
    cmd = [sys.executable, "-m", "bench.route_cost", "--requests", "8", "--agent-tokens", "12000"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for shape, n in (("1K new question", 8), ("32K new question", 8), ("agent step ~12K", 8)):
        row = re.search(rf"^\s*{re.escape(shape)}\s+{n}\s+{n} \|(.*)$", out, re.MULTILINE)
        assert row, out
        numbers = [float(x) for x in re.findall(r"\d+\.\d{3}", row.group(1))]
        assert len(numbers) == 8 and numbers[0] > 0 and numbers[4] > 0, row.group(0)  # CPU p50, tokenize
