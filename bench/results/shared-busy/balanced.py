"""A ``balanced.sh`` folder's runs per side (on / off): TTFT p90 each and its median, p50, cached share of the
ceiling, router CPU, load decisions and redecided reservations per run, the estimate's MAPE (median) and p50
bucket (each run), and how often a random split of the pooled runs differs in median p90 as much as the sides
do (a permutation test).

    python bench/results/shared-busy/balanced.py OUT [OUT ...]
"""

import json
import random
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def runs(outs: list[Path]) -> dict[tuple[str, str, float], dict[str, list[dict]]]:
    """Per (workload, policy, rate): each side's cells, in pair order."""
    cells: dict[tuple[str, str, float], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for out in outs:
        for results in sorted(out.glob("*/results.json"), key=lambda p: int(p.parent.name.rsplit("r", 1)[1])):
            m = re.fullmatch(r"\w+-(on|off)-r(\d+)", results.parent.name)
            if m is None:
                continue
            for workload, w in json.loads(results.read_text())["workloads"].items():
                for policy, p in w["policies"].items():
                    for c in p.get("cells", []):
                        cells[(workload, policy, c["offered_rate_rps"])][m[1]].append(c)
    return cells


def row(name: str, cells: list[dict]) -> str:
    p90 = [c["ttft_p90_s"] for c in cells]
    counters = [c.get("picker_counters", {}) for c in cells]
    load = [k.get('decisions{reason="load"}', 0) for k in counters]
    redecided = [k.get('shared_reservations{outcome="redecided"}', 0) for k in counters]
    errors = [c.get("ttft_estimate_error") or {} for c in cells]
    mape = [e.get("mape", 0.0) for e in errors]
    p50 = " / ".join(f"{e.get('p50_le')}" for e in errors)
    med = statistics.median
    return (
        f"| {name} | {len(cells)} | {' / '.join(f'{v:.3f}' for v in p90)} | **{med(p90):.3f}** | "
        f"{sum(v > 0.22 for v in p90)} | {med(c['ttft_p50_s'] for c in cells):.3f} | "
        f"{med(c['cached_share_of_ceiling'] or 0 for c in cells):.3f} | "
        f"{med(c['router_cpu_ms_per_req'] for c in cells):.1f} | {med(load):g} | {med(redecided):g} | "
        f"{med(mape):.3f} | {p50} |"
    )


def permutation_p(a: list[float], b: list[float], rounds: int = 20000) -> float:
    """Share of random splits of a + b whose medians differ at least as much as a's and b's."""
    seen = abs(statistics.median(a) - statistics.median(b))
    pool, rng, hits = a + b, random.Random(1), 0
    for _ in range(rounds):
        rng.shuffle(pool)
        hits += abs(statistics.median(pool[: len(a)]) - statistics.median(pool[len(a) :])) >= seen - 1e-12
    return hits / rounds


def main(outs: list[Path]) -> None:
    for key, sides in sorted(runs(outs).items()):
        print(f"\n{key[0]} {key[1]} @ {key[2]:g}\n")
        table(sides)


def table(sides: dict[str, list[dict]]) -> None:
    print(
        "| side | runs | TTFT p90 s, each (pair order) | median | > 0.22 s | p50 | cached / ceiling | "
        "router CPU ms/req | load decisions | redecided | estimate MAPE | estimate p50 bucket, each |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ("on", "off"):
        if sides.get(name):
            print(row(name, sides[name]))
    if sides.get("on") and sides.get("off"):
        a = [c["ttft_p90_s"] for c in sides["on"]]
        b = [c["ttft_p90_s"] for c in sides["off"]]
        print(
            f"\non / off median TTFT p90: {statistics.median(a) / statistics.median(b):.2f}x; "
            f"permutation p (medians differ this much by chance): {permutation_p(a, b):.3f}"
        )


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:]])
