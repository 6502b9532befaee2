#!/bin/bash
# low rates against the peers, on 2f3fe32 (wt-b), one run per cell
D=/tmp/s30/lowrate; mkdir -p $D; cd /work/wt-b; source .venv/bin/activate
for w in tenants mooncake; do
  python -m bench --workload $w --policies precise,sglang_cache_aware,vllm_kv_aware --rates 8 --repeat 1 --no-plots --out $D/$w > $D/$w.log 2>&1
done
echo done > $D/DONE
