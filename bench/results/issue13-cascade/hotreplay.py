"""Replay a picker log's decision lines (INFO) of a tenants@24 cell through ``HotBlocks`` (600 blocks per
backend), fed as the decider feeds it, across the cell's runs; print each cold placement (reason ``load``) with
every backend's estimate, hot blocks and groups homed so far, as the profile saw them.

``PYTHONPATH=. python bench/results/issue13-cascade/hotreplay.py PICKER_LOG [--reset]``; ``--reset``: forget
the hot sets between runs, as ``ObservedWrites`` does for ``HotBlocks`` on ``AllBlocksCleared``
(the fixed tree).
"""

import json
import sys
from pathlib import Path

from bench.suite.workloads import WORKLOADS
from extproc.backends.hot_blocks import HotBlocks
from extproc.types import BlockHash, EndpointId

plan = WORKLOADS["tenants"].plan(24.0, 0, 0, False)
calls = {s.calls[0].rid: s.calls[0] for s in plan.sessions}
start = {s.calls[0].rid: s.start_s for s in plan.sessions}
prefix_of: dict[tuple[int, ...], int] = {}
grp = {rid: prefix_of.setdefault(tuple(c.ids[:1536]), len(prefix_of)) for rid, c in calls.items()}
H = {rid: [BlockHash(hash(tuple(c.ids[: 16 * (i + 1)]))) for i in range(len(c.ids) // 16)] for rid, c in calls.items()}
lines = []
for line in Path(sys.argv[1]).read_text(errors="replace").splitlines():
    i = line.find('{"request_id"')
    if i >= 0 and "endpoint" in (e := json.loads(line[i:])):
        lines.append(e)
hb = HotBlocks(lambda e: 600)
for n in range(0, len(lines), 240):
    run = lines[n : n + 240]
    eps = sorted(run[0]["estimates_s"])
    short = {e: f"B{k}" for k, e in enumerate(eps)}
    if "--reset" in sys.argv:
        for e in eps:
            hb.forget(EndpointId(e))
    homes = dict.fromkeys(eps, 0)
    out = []
    for e in run:
        rid, pick = e["request_id"], e["endpoint"]
        if e["reason"] == "load":
            est = e["estimates_s"]
            cells = " ".join(f"{short[x]}={est[x]:.2f}/{hb.hot(EndpointId(x))}/{homes[x]}" for x in eps)
            out.append(f"  {rid:>9} t={start[rid]:.2f} g{grp[rid]:<2} -> {short[pick]}   est/hot/homes {cells}")
            homes[pick] += 1
        hb.routed(EndpointId(pick), H[rid], e["cached_tokens"] // 16, placed=e["reason"] == "load")
    reasons = {r: sum(x["reason"] == r for x in run) for r in sorted({x["reason"] for x in run})}
    print(f"run {n // 240}: reasons {reasons} homes {[homes[x] for x in eps]}")
    print("\n".join(out))
