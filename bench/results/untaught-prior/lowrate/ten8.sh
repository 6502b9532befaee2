#!/bin/bash
D=/tmp/s30/ten8; mkdir -p $D; cd /work/wt-b; source .venv/bin/activate
for i in 1 2; do
  python -m bench --workload tenants --policies sglang_cache_aware,precise --rates 8 --repeat 1 --no-plots --out $D/run-$i > $D/run-$i.log 2>&1
done
echo done > $D/DONE
