#!/bin/bash
# tenants at 8 req/s after fd4cd5c (wt-b), four runs, with sglang-router twice in the same hour; waits for CI
D=/tmp/s31/ten8; mkdir -p $D
while pgrep -f "ci/run" > /dev/null; do sleep 10; done
run() { cd /work/wt-b; source .venv/bin/activate
  python -m bench --workload tenants --policies $2 --rates 8 --repeat 1 --no-plots --out $D/$1 > $D/$1.log 2>&1; }
run p1 precise; run s1 sglang_cache_aware; run p2 precise; run p3 precise; run s2 sglang_cache_aware; run p4 precise
echo done > $D/DONE
