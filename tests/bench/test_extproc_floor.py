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
    for side in ("round_robin", "bare", "null", "picker", "authz", "picker-authz"):
        row = re.search(rf"^\s*{side} \|\s+5 \|.*\| 0$", out, re.MULTILINE)
        assert row, out
    for side in ("bare", "null", "authz"):  # each processor's pick was applied: every answer from its backend
        assert re.search(rf"^\s*{side} \|.*\|\s+100% \|\s+100% \| 0$", out, re.MULTILINE), out
    for side in ("picker", "picker-authz"):  # both pickers decided every request (a destination in Envoy's log)
        assert re.search(rf"^\s*{side} \|.*\|\s+100% \|\s+\d+% \| 0$", out, re.MULTILINE), out
    # each processor side really went through its own ext_proc server: its process spent CPU on the requests
    cpu = re.findall(r"^\s*(?:bare|null|picker|authz|picker-authz) \|.*\|\s+(-?\d+\.\d\d) \|.*\| 0$", out,
                     re.MULTILINE)  # fmt: skip
    assert len(cpu) == 5 and all(float(c) > 0.0 for c in cpu), out
