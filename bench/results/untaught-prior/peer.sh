#!/bin/bash
D=/tmp/s30/peer; mkdir -p $D; cd /work/wt-b; source .venv/bin/activate
for i in 1 2; do python -m bench --workload agents --policies vllm_kv_aware --rates 6,12 --repeat 1 --no-plots --out $D/kv-$i > $D/kv-$i.log 2>&1; done
echo done > $D/DONE
