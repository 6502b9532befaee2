#!/bin/bash
# Alternated runs of one workload and policy list from two worktrees, one benchmark at a time:
#   alternate.sh WORKLOAD POLICIES RATES RUNS OUT TREE_A TREE_B  ->  OUT/<workload>-<a|b>-r<i>/results.json
# (this stop: TREE_A = the change, TREE_B = the base, each a `git worktree` of its commit)
set -e
workload=$1 policies=$2 rates=$3 runs=$4 out=$5 a=$6 b=$7
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  for side in a b; do
    tree=$a; [ "$side" = b ] && tree=$b
    (cd "$tree" && .venv/bin/python -m bench --workload "$workload" --policies "$policies" --rates "$rates" \
      --repeat 1 --no-plots --out "$out/$workload-$side-r$i" > "$out/$workload-$side-r$i.log" 2>&1)
  done
done
