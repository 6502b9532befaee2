#!/bin/bash
# issue 13 move rule: before (wt-a, 01e6954) vs after (wt-b, lasting_hits), alternated, one benchmark at a time
D=/tmp/s32/moves; mkdir -p $D
while pgrep -f "setup.sh|pip install" > /dev/null; do sleep 10; done
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $2 --policies precise --rates $3 --repeat 1 --no-plots --out $D/$1-$2-$3-$4 > $D/$1-$2-$3-$4.log 2>&1; }
for round in 1 2; do
  if [ $round = 1 ]; then order="a b"; else order="b a"; fi
  i=0
  for cell in "tenants 8" "agents 6" "tenants 8" "agents 12" "tenants 24" "mooncake 8" "documents 8"; do
    i=$((i+1))
    for t in $order; do run $t $cell $round$i; done
  done
done
echo done > $D/DONE
