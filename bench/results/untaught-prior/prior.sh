#!/bin/bash
# base (wt-a) vs prior (wt-b), agents 6,12 alternated
D=/tmp/s30/prior; mkdir -p $D
for i in 1 2 3; do
  for side in b a; do
    cd /work/wt-$side; source .venv/bin/activate
    python -m bench --workload agents --policies precise --rates 6,12 --repeat 1 --no-plots --out $D/$side-$i > $D/$side-$i.log 2>&1
  done
done
echo done > $D/DONE
