#!/bin/bash
# agents at 6 and 12 req/s, tenants at 8: before (wt-a) vs after with chains_measured (wt-b), alternated
D=/tmp/s32/agents2; mkdir -p $D
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $2 --policies precise --rates $3 --repeat 1 --no-plots --out $D/$1-$2-$3-$4 > $D/$1-$2-$3-$4.log 2>&1; }
for round in 1 2; do
  if [ $round = 1 ]; then order="b a"; else order="a b"; fi
  for cell in "agents 6" "agents 12" "tenants 8"; do for t in $order; do run $t $cell $round; done; done
done
echo done > $D/DONE
