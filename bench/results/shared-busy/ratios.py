"""precise_x2 / precise TTFT p90 per invocation of an alternated folder (both policies in each invocation).

python bench/results/shared-busy/ratios.py OUT [...]   (side a = the change, b = the base)
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(outs: list[str]) -> None:
    ratios: dict[tuple[str, float, str], list[float]] = defaultdict(list)
    for out in outs:
        for results in sorted(Path(out).glob("*-[ab]-r*/results.json")):
            side = results.parent.name.rsplit("-", 2)[1]
            for workload, w in json.loads(results.read_text())["workloads"].items():
                cells = {p: {c["offered_rate_rps"]: c for c in v.get("cells", [])} for p, v in w["policies"].items()}
                for rate, one in cells.get("precise", {}).items():
                    two = cells.get("precise_x2", {}).get(rate)
                    if two is not None:
                        ratios[(workload, rate, side)].append(two["ttft_p90_s"] / one["ttft_p90_s"])
    print("| cell | side | x2 / one, each invocation | median |")
    print("|---|---|---|---|")
    for (workload, rate, side), each in sorted(ratios.items()):
        name = "change" if side == "a" else "base"
        shown = " / ".join(f"{r:.2f}" for r in each)
        print(f"| {workload} @ {rate:g} | {name} | {shown} | {statistics.median(each):.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1:])
