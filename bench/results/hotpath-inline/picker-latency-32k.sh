#!/bin/bash
# 32K through Envoy at c=1 and c=64, before (wt-base) vs after (main working tree), alternated
cd /work/main && source .venv/bin/activate
for r in 1 2; do
 for t in /work/wt-base /work/main; do
  echo "== round $r tree $t"
  python -m bench.picker_latency --quick --sizes 32K --concurrency 1,64 --agent-tokens 0 --verify-fraction 0 --picker-tree $t 2>&1 | grep -E "^ +3[0-9]{4} +(1|64) " 
 done
done
