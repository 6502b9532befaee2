"""A smoke test of ``python -m bench.scrape_cost``: a picker and its no-scrape floor come up, their idle CPU and
the parser's cost print. The costs are not asserted (this box is shared and noisy)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from bench.stack_config import REPO


@pytest.mark.slow
def test_smoke_run_prints_the_idle_cost_of_a_picker_and_its_floor(tmp_path) -> None:
    cmd = [sys.executable, "-m", "bench.scrape_cost", "--backends", "1", "--seconds", "2", "--windows", "1",
           "--workdir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"^tree 0: .*\|\s+\d+\.\d \|\s+-?\d+ us\s+\|\s+\d+\.\d \|\s+-?\d+ us$", out, re.MULTILINE), out
    assert re.search(r"^floor \(tree 0, no scrapes\)\s+\|", out, re.MULTILINE), out
    parse = re.search(r"^tree 0:((?:\s+\d+\.\d){4})$", out, re.MULTILINE)  # sim and vLLM pages, whole and narrowed
    assert parse and all(float(us) > 0 for us in parse.group(1).split()), out
