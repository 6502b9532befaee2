"""What the picker priced each request on, beside what the simulator did, from a cell trace of a picker patched
with ``debug-terms.patch`` (one ``extproc.debugterms`` line per decision: the pick's estimate terms, load and cost
model).

    python bench/results/learned-drift/terms.py TRACE.jsonl PICKER.log

Per request, in arrival order: the engine-side truth (``ahead``: how long the backend's earlier requests still
held it when this one arrived, by their first tokens; ``open``: how many of them), the prediction against the
simulator's own TTFT, and the terms. Then the signed and absolute error's medians by time in the cell and by the
decode batch the request joined.
"""

import json
import sys
from collections import defaultdict


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def main(trace_path: str, log_path: str) -> None:
    rows = {}
    with open(trace_path) as lines:
        for line in lines:
            row = json.loads(line)
            if row.get("ok") and "estimates_s" in row:
                rows[row["rid"]] = row
    terms = {}
    with open(log_path) as lines:
        for line in lines:
            if "extproc.debugterms" in line:
                entry = json.loads(line[line.index("{") :])
                terms[entry["rid"]] = entry
    t0 = min(r["engine_arrival_s"] for r in rows.values())
    by_backend = defaultdict(list)
    for r in rows.values():
        r["arr"] = r["engine_arrival_s"] - t0
        r["ft"] = r["arr"] + r["model_ttft_s"]
        r["pred"] = r["estimates_s"][r["picked"]]
        r["err"] = (r["pred"] - r["model_ttft_s"]) / r["model_ttft_s"]
        by_backend[r["backend"]].append(r)
    for reqs in by_backend.values():
        reqs.sort(key=lambda r: r["arr"])
        for i, r in enumerate(reqs):
            r["ahead"] = max([x["ft"] for x in reqs[:i]] + [r["arr"]]) - r["arr"]
            r["open"] = sum(1 for x in reqs[:i] if x["ft"] > r["arr"])
    print(" t     ep    unc  ahead  open | pred  act   err |  work  own  run queue  busy qtok wait qreq kv | cost")
    seen = []
    for r in sorted(rows.values(), key=lambda r: r["arr"]):
        t = terms.get(r["rid"])
        if t is None:
            continue
        seen.append((r["arr"], r["err"], t["running"]))
        unc = r["prompt_tokens"] - r["cached_tokens"]
        print(
            f"{r['arr']:5.2f} {r['backend'][-5:]} {unc:5d} {r['ahead']:5.3f} {r['open']:2d} | "
            f"{r['pred']:.3f} {r['model_ttft_s']:.3f} {r['err']:+.2f} | {t['work_s']:.3f} {t['own_s']:.3f} "
            f"{t['running']:2d} {t['queue_s']:.3f} {t['busy_s']:.3f} {t['qtok']:5d} {t['waiting']:2d} "
            f"{t['queued_req']:2d} {t['kv']:.2f} | {t['cost']}"
        )
    groups = {
        "all": lambda a, r: True,
        "t < 3 s": lambda a, r: a < 3,
        "3 <= t < 5 s": lambda a, r: 3 <= a < 5,
        "t >= 5 s": lambda a, r: a >= 5,
        "running < 10": lambda a, r: r < 10,
        "running >= 15": lambda a, r: r >= 15,
    }
    print("\n(predicted - actual) / actual: signed p50 / absolute p50")
    for name, keep in groups.items():
        errs = [e for a, e, r in seen if keep(a, r)]
        print(f"  {name:14s} n {len(errs):3d}  {median(errs):+.2f} / {median([abs(e) for e in errs]):.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
