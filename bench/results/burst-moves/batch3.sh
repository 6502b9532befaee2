#!/bin/bash
# agents at 6 and documents at 8: before (wt-a) vs after with chains_measured (wt-b), alternated
D=/tmp/s32/batch3; mkdir -p $D
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $2 --policies precise --rates $3 --repeat 1 --no-plots --out $D/$1-$2-$3-$4 > $D/$1-$2-$3-$4.log 2>&1; }
for round in 3 4 5; do
  if [ $((round % 2)) = 1 ]; then order="a b"; else order="b a"; fi
  for cell in "agents 6" "documents 8"; do
    if [ "$cell" = "documents 8" ] && [ $round = 5 ]; then continue; fi
    for t in $order; do run $t $cell $round; done
  done
done
echo done > $D/DONE
