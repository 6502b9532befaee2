#!/bin/bash
# agents at 6 and 12 req/s: before (wt-a) vs after (wt-b), three more rounds, alternated
D=/tmp/s32/agents; mkdir -p $D
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload agents --policies precise --rates $2 --repeat 1 --no-plots --out $D/$1-agents-$2-$3 > $D/$1-agents-$2-$3.log 2>&1; }
for round in 3 4 5; do
  if [ $((round % 2)) = 1 ]; then order="a b"; else order="b a"; fi
  for rate in 6 12; do for t in $order; do run $t $rate $round; done; done
done
echo done > $D/DONE
