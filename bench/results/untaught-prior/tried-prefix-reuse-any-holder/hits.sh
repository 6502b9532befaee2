#!/bin/bash
# the prefix's reuse from any holder of its depth (wt-b, uncommitted) vs 0abbfd1 (wt-a), alternated
D=/tmp/s30/hits; mkdir -p $D
run() { cd /work/wt-$1; source .venv/bin/activate; python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out $D/$2 > $D/$2.log 2>&1; }
for i in 1 2 3; do run b ag-b-$i agents 6,12; run a ag-a-$i agents 6,12; done
for i in 1 2; do run a doc-a-$i documents 8; run b doc-b-$i documents 8; done
echo done > $D/DONE
