#!/bin/bash
# FIFO-matched calibration (wt-b) vs interval sums (wt-a = b010114), alternated, one benchmark at a time.
# (Run as three scripts in this order; the last two waited for the one before.)
D=/tmp/s31/fifo; mkdir -p $D
run() { # side name workload rates
  cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1
}
for i in 1 2; do
  for side in b a; do run $side ag-$side-$i agents 6,12; done
  for side in a b; do run $side ten-$side-$i tenants 8; done
  for side in b a; do run $side doc-$side-$i documents 8; done
  for side in a b; do run $side moon-$side-$i mooncake 8; done
done
for i in 1 2; do for side in b a; do run $side uniq-$side-$i unique 16; done; done
for i in 1 2; do for side in a b; do run $side t24-$side-$i tenants 24; done; done
