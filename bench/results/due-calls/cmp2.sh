#!/bin/bash
D=/tmp/s34/runs   # copied to bench/results/due-calls/runs
run() { cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies ${5:-precise} --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
run base kv-ag-r1 agents 6,12 vllm_kv_aware
for t in due base; do run $t $t-ag-r4 agents 6,12; done
for t in base due; do run $t $t-doc-r1 documents 8; done
for t in due base; do run $t $t-moon-r1 mooncake 8,16; done
for t in base due; do run $t $t-ten-r1 tenants 8,24; done
for t in due base; do run $t $t-ag-r5 agents 6,12; done
run base kv-ag-r2 agents 6,12 vllm_kv_aware
for t in base due; do run $t $t-moon-r2 mooncake 8,16; done
echo done > $D/DONE2
