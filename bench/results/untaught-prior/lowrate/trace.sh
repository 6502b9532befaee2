#!/bin/bash
D=/tmp/s30/ttrace; mkdir -p $D; cd /work/wt-b; source .venv/bin/activate
for p in precise sglang_cache_aware; do
  python -m bench.cell_trace --workload tenants --policy $p --rates 8 --out $D/$p > $D/$p.log 2>&1
done
echo done > $D/DONE
