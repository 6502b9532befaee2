#!/bin/bash
cd /work/wt-a; source .venv/bin/activate
mkdir -p /tmp/s33/rung
for i in 1 2 3; do
python -m bench --workload agents --policies precise --rates 12 --repeat 1 --no-plots --out /tmp/s33/rung/precise-12-$i > /tmp/s33/rung/precise-12-$i.log 2>&1
done
python -m bench --workload agents --policies vllm_kv_aware --rates 12 --repeat 1 --no-plots --out /tmp/s33/rung/kv-12-1 > /tmp/s33/rung/kv-12-1.log 2>&1
echo done > /tmp/s33/rung/DONE
