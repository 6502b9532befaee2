"""Per workload, rate and side of an alternated folder (``alternate.sh``: ``<workload>-<a|b>-r<i>/``): the runs'
TTFT p90 and router CPU per request, their medians, and the change / base ratio of the medians.

    python bench/results/request-paced/sides.py OUT [OUT ...]   (side a = the change, b = the base)
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main(outs: list[Path]) -> None:
    cells: dict[tuple[str, str, float, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for out in outs:
        for results in sorted(out.glob("*/results.json")):
            m = re.fullmatch(r"(\w+)-([ab])-r\d+", results.parent.name)
            if m is None:
                continue
            for workload, w in json.loads(results.read_text())["workloads"].items():
                for policy, p in w["policies"].items():
                    for c in p.get("cells", []):
                        got = cells[(workload, policy, c["offered_rate_rps"], m[2])]
                        got["p90"].append(c["ttft_p90_s"])
                        got["cpu"].append(c["router_cpu_ms_per_req"])
                        got["cached"].append(c["cached_share_of_ceiling"] or 0.0)
    print("| cell | side | runs | TTFT p90 s, each | median | router CPU ms/req, each | median |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({k[:3] for k in cells})
    for key in keys:
        med = {}
        for side in "ab":
            got = cells.get((*key, side))
            if not got:
                continue
            med[side] = statistics.median(got["p90"]), statistics.median(got["cpu"])
            name = "change" if side == "a" else "base"
            print(
                f"| {key[0]} {key[1]} @ {key[2]:g} | {name} | {len(got['p90'])} | "
                f"{' / '.join(f'{v:.3f}' for v in got['p90'])} | {med[side][0]:.3f} | "
                f"{' / '.join(f'{v:.1f}' for v in got['cpu'])} | {med[side][1]:.2f} |"
            )
        if len(med) == 2:
            print(
                f"| {key[0]} {key[1]} @ {key[2]:g} | change / base | | | {med['a'][0] / med['b'][0]:.2f}x | | "
                f"{med['a'][1] / med['b'][1]:.2f}x |"
            )


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
