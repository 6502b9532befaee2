#!/bin/bash
cd /work/wt-b; source .venv/bin/activate
mkdir -p /tmp/s33/probe
for cf in 4 4 1; do
i=$((i+1))
PROBE_CF=$cf python -m bench --workload agents --policies precise --rates 12 --repeat 1 --no-plots --out /tmp/s33/probe/cf$cf-$i > /tmp/s33/probe/cf$cf-$i.log 2>&1
done
echo done > /tmp/s33/probe/DONE
