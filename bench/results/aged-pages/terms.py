"""The TTFT estimate's terms by the age of the page it was made on, from cell traces taken with ``diag.patch``
(which logs, per decision, every candidate's load and page age, and the pick's estimate terms and cost).

    python bench/results/aged-pages/terms.py TRACE.jsonl[.gz] [...]

Per (page age in 100 ms buckets, a prefill of ours predicted to run on the pick): estimate - engine TTFT and
what the estimate is made of, in seconds: the learned fixed cost, this request's own prefill, the prefill queued
ahead, the queue term ((waiting + routed since the page) x request_overhead_s x the learned queue_scale), the
busy floor's share above them; then the load behind them.
"""

import gzip
import json
import re
import statistics as st
import sys

PRIOR = {"base_s": 0.01, "prefill_scale": 1.0, "interference_per_running": 0.004, "queue_scale": 1.0}


def main(paths: list[str]) -> None:
    groups: dict[tuple[int, bool], list[tuple[float, ...]]] = {}
    for path in paths:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            lines = f.read().splitlines()
        for line in lines:
            r = json.loads(line)
            d = r.get("diag")
            if not r["ok"] or r["model_ttft_s"] is None or not d or "terms" not in d:
                continue
            est, act = r["estimates_s"][r["picked"]], r["model_ttft_s"]
            load, (work, running, queue, fixed, own, busy, share) = d["loads"][r["picked"]], d["terms"]
            c = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.e-]+)", d["cost"])} or PRIOR
            slow = 1 + c["interference_per_running"] * running
            weighted = c["base_s"] + c["prefill_scale"] * work * slow + c["queue_scale"] * queue
            floor = busy + c["base_s"] + c["prefill_scale"] * own * slow if busy > 0 else 0.0
            key = (min(int(load[5] / 0.1), 2), busy > 0)
            groups.setdefault(key, []).append((
                est - act, c["base_s"], c["prefill_scale"] * own * slow, c["prefill_scale"] * (work - own) * slow,
                c["queue_scale"] * queue, share * max(floor - weighted, 0.0), fixed, load[1], load[0], act,
            ))  # fmt: skip
    print("(page age, prefill of ours running): n | est - act | base | own prefill | prefill ahead | queue term | "
          "floor | fixed | routed since page | waiting | act")  # fmt: skip
    for key, rows in sorted(groups.items()):
        m = [st.mean(x[i] for x in rows) for i in range(10)]
        print(
            f"({key[0] * 100} ms+, {key[1]}): {len(rows):3d} | {m[0]:+.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.3f} | "
            f"{m[4]:.3f} | {m[5]:.3f} | {m[6]:.3f} | {m[7]:.2f} | {m[8]:.2f} | {m[9]:.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
