#!/bin/bash
# agents@6 as first vs second cell of an invocation, alternated
source /work/wt-a/.venv/bin/activate
cd /work/wt-a
for i in 1 2 3; do
  python -m bench --workload agents --policies precise --rates 12,6 --repeat 1 --no-plots --out /tmp/s30/order/late-$i > /tmp/s30/order/late-$i.log 2>&1
  python -m bench --workload agents --policies precise --rates 6,12 --repeat 1 --no-plots --out /tmp/s30/order/first-$i > /tmp/s30/order/first-$i.log 2>&1
done
echo done > /tmp/s30/order/DONE
