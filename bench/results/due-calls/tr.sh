#!/bin/bash
D=/tmp/s34/traces; mkdir -p $D
while [ ! -f /tmp/s34/runs/DONE2 ]; do sleep 5; done
cd /work/wt-due; source .venv/bin/activate
for i in 1 2; do python -m bench.cell_trace --workload agents --policy precise --rates 6,12 --out $D/due-$i > $D/due-$i.log 2>&1; done
echo done > $D/DONE
