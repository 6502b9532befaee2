"""The TTFT estimate's error by the age of the page it was made on, from cell traces taken with the diagnostic
patch (``diag.patch``: each decision also logs every candidate's load and the page's age).

    python bench/results/aged-pages/bias.py TRACE.jsonl[.gz] [...]

Per file: the error (estimate - engine TTFT) / engine TTFT of each pick, by the age of the pick's page (100 ms
buckets), then by (page fresh or 100 ms+ old, requests routed since the page, requests it showed waiting).
"""

import gzip
import json
import statistics as st
import sys


def rows(path: str) -> list[tuple[float, float, float, list[float]]]:
    out = []
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        r = json.loads(line)
        if not r["ok"] or r["model_ttft_s"] is None or not r.get("diag"):
            continue
        est, act = r["estimates_s"][r["picked"]], r["model_ttft_s"]
        out.append((est, act, (est - act) / act, r["diag"]["loads"][r["picked"]]))
    return out


def main(paths: list[str]) -> None:
    for path in paths:
        got = rows(path)
        print(f"{path}: n {len(got)}  mape {st.mean(abs(e) for *_, e, _ in got):.3f}")
        by_age: dict[int, list[float]] = {}
        for _, _, e, load in got:
            by_age.setdefault(min(int(load[5] / 0.1), 3), []).append(e)
        for k, v in sorted(by_age.items()):
            print(
                f"  page {k * 100} ms+ old: n {len(v):3d}  mean error {st.mean(v):+.3f}  mean |error| "
                f"{st.mean(map(abs, v)):.3f}"
            )
    groups: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for path in paths:
        for est, act, _, load in rows(path):
            key = ("100ms+" if load[5] >= 0.1 else "fresh", min(int(load[1]), 3), min(int(load[0]), 2))
            groups.setdefault(key, []).append((est, act))
    print("all files: (page, routed since it (3 = 3+), shown waiting (2 = 2+)): estimate - engine TTFT, seconds")
    for key, v in sorted(groups.items()):
        error = st.mean(e - a for e, a in v)
        print(
            f"  {key}: n {len(v):3d}  est - act {error:+.3f}  est {st.mean(e for e, _ in v):.3f}"
            f"  act {st.mean(a for _, a in v):.3f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
