#!/bin/bash
D=/tmp/s34/runs   # copied to bench/results/due-calls/runs
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
for r in 1 2 3; do
  if [ $r = 2 ]; then order="due base"; else order="base due"; fi
  for t in $order; do run $t $t-ag-r$r agents 6,12; done
done
echo done > $D/DONE1
