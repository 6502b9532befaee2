"""Idle pickers of several trees side by side, their CPU from ``/proc/PID/task/*/schedstat`` (ns resolution).

    python bench/results/ceiling-on-round/idle_precise.py TREE [TREE ...]      # run from a tree with bench/
    SCRAPE_S=3600 python bench/results/ceiling-on-round/idle_precise.py ...    # no scrape rounds: the floor

Each tree's picker runs in its own stack (4 fast simulators with KV events), all at once, and is read over the
same eight 10 s windows. ``bench.scrape_cost`` reads CPU in clock ticks (0.67 ms/s steps per 15 s window), too
coarse for a change of a wake-up or two a second.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.stack import Stack, StackSpec

WINDOWS, WINDOW_S = 8, 10.0


def process_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, ns."""
    return sum(int((t / "schedstat").read_text().split()[0]) for t in Path(f"/proc/{pid}/task").iterdir())


def main(trees: list[str]) -> None:
    interval_s = float(os.environ.get("SCRAPE_S", "0.1"))
    with contextlib.ExitStack() as stacks, tempfile.TemporaryDirectory() as workdir:
        pids = []
        for i, tree in enumerate(trees):
            sub = Path(workdir) / str(i)
            sub.mkdir()
            spec = StackSpec(backends=4, envoy="picker", sim_profile="fast", kv_events=True, picker_tree=Path(tree),
                             picker_overrides={"scrape": {"interval_s": interval_s}})  # fmt: skip
            pids.append(stacks.enter_context(Stack(spec, sub)).picker_pids()[0])
        time.sleep(3.0)  # past start-up work
        per_s: dict[str, list[float]] = {t: [] for t in trees}
        for _ in range(WINDOWS):
            before, t0 = [process_ns(p) for p in pids], time.monotonic()
            time.sleep(WINDOW_S)
            took = time.monotonic() - t0
            for tree, pid, ns in zip(trees, pids, before, strict=True):
                per_s[tree].append((process_ns(pid) - ns) / took / 1e6)
    for tree, values in per_s.items():
        ordered = sorted(values)
        median = (ordered[WINDOWS // 2 - 1] + ordered[WINDOWS // 2]) / 2
        print(f"{tree}: ms/s per {WINDOW_S:.0f} s window {' '.join(f'{v:.2f}' for v in values)} | median {median:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
