#!/bin/bash
source /work/wt-a/.venv/bin/activate; cd /work/wt-a; D=/tmp/s30/learn; mkdir -p $D
python -m bench --workload agents --policies precise --rates 6,6,6 --repeat 1 --no-plots --out $D/on > $D/on.log 2>&1 &
/tmp/s30/poll.sh $D/on.log $D/on.gauges; wait
echo done > $D/DONE
