"""An idle picker's CPU per thread: 4 simulators and one precise picker (``bench.stack``), no traffic, 30 s.

python bench/results/idle-stop44/idle_threads.py WORKDIR
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())

from bench.stack import Stack, StackSpec

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, tuple[str, float, float]]:
    """{thread id: (name, user s, system s)} of ``pid``'s threads."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, int(fields[11]) / TICKS_PER_S, int(fields[12]) / TICKS_PER_S)
    return out


def main(workdir: Path) -> None:
    with Stack(StackSpec(backends=4, pickers=1, kv_events=True), workdir / "stack") as stack:
        pid = stack.picker_pids()[0]
        time.sleep(5)  # past the start-up
        before, t0 = thread_cpu_s(pid), time.monotonic()
        time.sleep(30)
        after, span_s = thread_cpu_s(pid), time.monotonic() - t0
    for tid, (name, user_s, sys_s) in after.items():
        _, user0, sys0 = before.get(tid, (name, 0.0, 0.0))
        user, system = 1000 * (user_s - user0) / span_s, 1000 * (sys_s - sys0) / span_s
        if user + system > 0:
            print(f"{tid} {name:16s} {user + system:6.2f} ms/s (user {user:.2f}, system {system:.2f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
