#!/bin/bash
# alternated base (wt-a, ad13096) / wt-c (censored starts + reuse on the most-hit holder, gated by chains)
D=/tmp/s33/runs4; mkdir -p $D
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="c a"; else order="a c"; fi
  for t in $order; do run $t $t-ag612-r$round agents 6,12; done
  if [ $round -le 2 ]; then
    for t in $order; do run $t $t-doc8-r$round documents 8; done
    for t in $order; do run $t $t-moon8-r$round mooncake 8; done
  fi
done
for t in c a; do run $t $t-ten8-r1 tenants 8; done
for t in a c; do run $t $t-ten24-r1 tenants 24; done
echo done > $D/DONE
