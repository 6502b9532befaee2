#!/bin/bash
cd /work/wt-b; source .venv/bin/activate
mkdir -p /tmp/s33/probe6
i=0
for cf in 4 1 4 1; do
i=$((i+1))
PROBE_CF=$cf python -m bench --workload agents --policies precise --rates 6 --repeat 1 --no-plots --out /tmp/s33/probe6/cf$cf-$i > /tmp/s33/probe6/cf$cf-$i.log 2>&1
done
echo done > /tmp/s33/probe6/DONE
