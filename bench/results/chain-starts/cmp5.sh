#!/bin/bash
D=/tmp/s33/runs4
while [ ! -f $D/DONE ]; do sleep 5; done
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
for round in 4 5; do
  if [ $((round % 2)) = 1 ]; then order="c a"; else order="a c"; fi
  for t in $order; do run $t $t-ag612-r$round agents 6,12; done
done
for t in c a; do run $t $t-moon16-r1 mooncake 16; done
echo done > $D/DONE5
