#!/bin/bash
cd /work/wt-t; source .venv/bin/activate
mkdir -p /tmp/s33/trl
for i in 1 2; do
python -m bench.cell_trace --workload agents --policy precise --rates 6,12 --out /tmp/s33/trl/$i > /tmp/s33/trl/$i.log 2>&1
done
python -m bench.cell_trace --workload agents --policy vllm_kv_aware --rates 6 --out /tmp/s33/trl/kv > /tmp/s33/trl/kv.log 2>&1
echo done > /tmp/s33/trl/DONE
