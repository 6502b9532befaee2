"""An idle picker (4 fast simulators, scrape every 0.1 s) sampled by py-spy for 30 s at 1 kHz, on-CPU samples
only: collapsed stacks written to OUT. py-spy is not a project dependency: install it in a venv of its own and
name it in ``PY_SPY``.

    PY_SPY=/tmp/spyenv/bin/py-spy python bench/results/scrape-cost/spy_idle.py OUT
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.stack import Stack, StackSpec

SPEC = StackSpec(backends=4, envoy="picker", sim_profile="fast")

with tempfile.TemporaryDirectory() as tmp, Stack(SPEC, Path(tmp)) as stack:
    time.sleep(3)  # past start-up (warm-up, first discovery)
    pid = stack.picker_pids()[0]
    argv = [os.environ.get("PY_SPY", "py-spy"), "record", "-p", str(pid), "-r", "1000", "-d", "30", "-f", "raw"]
    subprocess.run([*argv, "-o", sys.argv[1], "--nonblocking"], check=False)
