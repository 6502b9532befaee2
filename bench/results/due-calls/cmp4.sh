#!/bin/bash
D=/tmp/s34/runs4; mkdir -p $D   # copied to runs-own/
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies ${5:-precise} --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
for r in 1 2 3 4; do
  if [ $((r % 2)) = 0 ]; then order="due2 due"; else order="due due2"; fi
  for t in $order; do run $t $t-ag-r$r agents 6,12; done
  if [ $r = 2 ]; then run base kv-ag-r1 agents 6,12 vllm_kv_aware; fi
done
echo done > $D/DONE
