#!/bin/bash
# Two trees, one cell, in pairs whose order alternates (odd pairs the new tree first, even pairs the old first),
# one benchmark at a time; folders named as balanced.sh's (on: the new tree, off: the old) for its summary:
#   trees.sh WORKLOAD POLICIES RATES PAIRS OUT NEW_TREE OLD_TREE
#   -> OUT/<workload>-<on|off>-r<i>/results.json; summary: python bench/results/shared-busy/balanced.py OUT
set -e
workload=$1 policies=$2 rates=$3 pairs=$4 out=$5 new=$6 old=$7
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  order="on off"; [ $((i % 2)) -eq 0 ] && order="off on"
  for side in $order; do
    tree=$old; [ "$side" = on ] && tree=$new
    (cd "$tree" && .venv/bin/python -m bench --workload "$workload" --policies "$policies" --rates "$rates" \
      --repeat 1 --no-plots --out "$out/$workload-$side-r$i" > "$out/$workload-$side-r$i.log" 2>&1)
  done
done
