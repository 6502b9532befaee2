#!/bin/bash
# prior (wt-b) vs base (wt-a), alternated: the workloads that must not move, then agents again
D=/tmp/s30/broad; mkdir -p $D
run() { # side name workload rates
  cd /work/wt-$1; source .venv/bin/activate
  python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1
}
for i in 1 2; do
  for side in b a; do run $side doc-$side-$i documents 8; done
  for side in a b; do run $side ten-$side-$i tenants 24; done
  for side in b a; do run $side moon-$side-$i mooncake 8; done
  for side in a b; do run $side uniq-$side-$i unique 16; done
done
for i in 4 5 6; do for side in b a; do run $side ag-$side-$i agents 6,12; done; done
echo done > $D/DONE
