"""A smoke test of ``python -m bench.extproc_floor``: it runs with a few requests per side, every side answers
200, and its table prints. The latencies are not asserted (this box is shared and noisy)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.stack_config import REPO


@pytest.mark.envoy
@pytest.mark.slow
def test_smoke_run_prints_every_side_with_no_errors() -> None:
    cmd = [sys.executable, "-m", "bench.extproc_floor", "--requests", "5"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for side in ("round_robin", "bare", "null", "picker"):
        row = re.search(rf"^\s*{side} \|\s+5 \|.*\| 0$", out, re.MULTILINE)
        assert row, out
    # each processor side really went through its own ext_proc server: its process spent CPU on the requests
    cpu = re.findall(r"^\s*(?:bare|null|picker) \|.*\|\s+(-?\d+\.\d\d) \| 0$", out, re.MULTILINE)
    assert len(cpu) == 3 and all(float(c) > 0.1 for c in cpu), out
