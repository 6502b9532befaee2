#!/bin/bash
# Three alternated pairs of documents traces: worktree /work/wt-a (base) against /work/wt-b (the change).
# Each worktree: `git worktree add --detach`, tokenizer_cache/* and .venv linked from the main checkout.
OUT=${1:-/tmp/ahead-of-body}
for i in 1 2 3; do
  for t in a b; do
    cd /work/wt-$t && source .venv/bin/activate
    echo "=== run $i tree $t $(date +%T)"
    python -m bench.cell_trace --workload documents --policy precise --rates 8,16 --out "$OUT/$t$i" 2>&1 | grep -E "n 128|rps"
  done
done
echo DONE
