#!/bin/bash
# Alternated runs of one workload from two worktrees, one benchmark at a time:
#   alternate.sh WORKLOAD RATES RUNS OUT TREE_A TREE_B  ->  OUT/<workload>-<a|b>-r<i>/results.json
# (this stop: TREE_A = /work/wt-exp, the change; TREE_B = /work/wt-new, base c0a5350)
set -e
workload=$1 rates=$2 runs=$3 out=$4 a=$5 b=$6
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  for side in a b; do
    tree=$a; [ "$side" = b ] && tree=$b
    (cd "$tree" && .venv/bin/python -m bench --workload "$workload" --policies precise --rates "$rates" --repeat 1 \
      --no-plots --out "$out/$workload-$side-r$i" > "$out/$workload-$side-r$i.log" 2>&1)
  done
done
