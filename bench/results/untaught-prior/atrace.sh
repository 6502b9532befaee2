#!/bin/bash
D=/tmp/s30/atrace; mkdir -p $D; cd /work/wt-b; source .venv/bin/activate
python -m bench.cell_trace --workload agents --policy precise --rates 6,6 --out $D/precise > $D/precise.log 2>&1
echo done > $D/DONE
