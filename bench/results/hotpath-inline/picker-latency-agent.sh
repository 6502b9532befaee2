#!/bin/bash
# The agent step through Envoy, before vs after, alternated. Run twice:
#   BEFORE=/work/wt-base SIZES=1K         (the inline change: wt-base = c8d77b5; output picker-latency-agent.txt)
#   BEFORE=/work/wt-a SIZES=32K           (the kept heap: wt-a = b010114; output picker-latency-malloc.txt)
cd /work/main && source .venv/bin/activate
for r in 1 2 3; do
 for t in $BEFORE /work/main; do
  echo "== round $r tree $t"
  python -m bench.picker_latency --quick --sizes $SIZES --concurrency 1 --agent-tokens 100000 --verify-fraction 0 \
    --picker-tree $t 2>&1 | grep -E "added p50|^ +[0-9]+ +1 |picker CPU per step|idle cost"
 done
done
