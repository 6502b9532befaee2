#!/bin/bash
# One tree, one cell, a picker flag on and off in pairs whose order alternates (odd pairs on first, even pairs
# off first), one benchmark at a time:
#   FLAG='index.share_busy=true' [OFF_FLAG='index.share_busy=false'] balanced.sh WORKLOAD POLICIES RATES PAIRS OUT TREE
#   -> OUT/<workload>-<on|off>-r<i>/results.json; summary: python balanced.py OUT
set -e
workload=$1 policies=$2 rates=$3 pairs=$4 out=$5 tree=$6
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  order="on off"; [ $((i % 2)) -eq 0 ] && order="off on"
  for side in $order; do
    extra=""; [ -n "$OFF_FLAG" ] && extra="--picker-set $OFF_FLAG"
    [ "$side" = on ] && extra="--picker-set $FLAG"
    (cd "$tree" && .venv/bin/python -m bench --workload "$workload" --policies "$policies" --rates "$rates" \
      --repeat 1 --no-plots --out "$out/$workload-$side-r$i" $extra > "$out/$workload-$side-r$i.log" 2>&1)
  done
done
