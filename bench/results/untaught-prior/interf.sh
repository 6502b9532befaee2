#!/bin/bash
# is the rest of the first cell's gap the interference the model learns? prior 0.08 vs the default 0.004, alternated
D=/tmp/s30/interf; mkdir -p $D; cd /work/wt-b; source .venv/bin/activate
for i in 1 2 3; do
  python -m bench --workload agents --policies precise --rates 6,12 --repeat 1 --no-plots --out $D/i08-$i --picker-set scheduling.decode_slowdown_per_running=0.08 > $D/i08-$i.log 2>&1
  python -m bench --workload agents --policies precise --rates 6,12 --repeat 1 --no-plots --out $D/base-$i > $D/base-$i.log 2>&1
done
echo done > $D/DONE
