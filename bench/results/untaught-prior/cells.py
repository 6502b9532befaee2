"""One line per precise cell of the result folders given (default: every folder here): TTFT, ceiling, spread,
router CPU, the TTFT estimate's error (mape, p50/p90 bucket bounds, actual/predicted) and the decisions.

    python bench/results/untaught-prior/cells.py [FOLDER ...]
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main(folders: list[Path]) -> None:
    for results in sorted(p for f in folders for p in f.rglob("results.json")):
        run = results.parent.relative_to(HERE) if results.is_relative_to(HERE) else results.parent
        for workload, w in json.loads(results.read_text())["workloads"].items():
            for policy, p in w["policies"].items():
                for c in p.get("cells", []):
                    e = c.get("ttft_estimate_error") or {}
                    dec = {
                        k.split('"')[1]: v for k, v in c.get("picker_counters", {}).items() if k.startswith("decisions")
                    }
                    ceiling = c.get("cached_share_of_ceiling")
                    print(
                        f"{run!s:18s} {workload:9s} {policy:13s} {c['offered_rate_rps']:5.1f} rps  "
                        f"p50 {c['ttft_p50_s']:.3f} p90 {c['ttft_p90_s']:.3f}  "
                        f"ceiling {'-' if ceiling is None else f'{ceiling:.3f}'}  cv {c['load_spread_cv']:.3f}  "
                        f"cpu {c['router_cpu_ms_per_req']:.1f}  err mape {e.get('mape')} p50<={e.get('p50_le')} "
                        f"p90<={e.get('p90_le')} a/p {e.get('actual_over_predicted')}  {dec}"
                    )


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or [HERE])
