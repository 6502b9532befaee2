"""TTFT p90, requests per endpoint and router CPU per run of the alternated folders given: one line per policy
and run, then the two-replica / one-replica TTFT p90 ratio per run.

    python bench/results/shared-hot-sets/table.py OUT [OUT ...]   (OUT as alternate.sh wrote it)
"""

import json
import sys
from pathlib import Path


def main(outs: list[Path]) -> None:
    for out in outs:
        for results in sorted(out.glob("*/results.json")):
            for w in json.loads(results.read_text())["workloads"].values():
                p90 = {}
                for policy, p in w["policies"].items():
                    for c in p.get("cells", []):
                        p90[policy] = c["ttft_p90_s"]
                        redis = c.get("redis") or {}
                        print(
                            f"{results.parent.name:16s} {policy:11s} {c['offered_rate_rps']:5.1f} rps  "
                            f"p90 {c['ttft_p90_s']:.3f} s  per endpoint {c['backend_requests']}  "
                            f"cached {c['cached_share_of_ceiling']:.3f} of ceiling  "
                            f"cpu {c['router_cpu_ms_per_req']:.1f} ms/req  xadd {redis.get('xadd', '-')}"
                        )
                if "precise" in p90 and "precise_x2" in p90:
                    print(f"{results.parent.name:16s} x2 / one: {p90['precise_x2'] / p90['precise']:.2f}")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
