#!/bin/bash
# agent step through Envoy, before (wt-base) vs after (main working tree), alternated
cd /work/main && source .venv/bin/activate
for r in 1 2 3; do
 for t in /work/wt-base /work/main; do
  echo "== round $r tree $t"
  python -m bench.picker_latency --quick --sizes 1K --concurrency 1 --agent-tokens 100000 --verify-fraction 0 --picker-tree $t 2>&1 | grep -E "added p50|1014    1 |picker CPU per step|idle cost"
 done
done
