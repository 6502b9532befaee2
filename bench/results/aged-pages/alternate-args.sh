#!/bin/bash
# Alternated runs of one workload and policy list from two trees, one benchmark at a time, each side with its own
# extra `python -m bench` arguments (e.g. --picker-set scrape.interval_s=0.3):
#   ARGS_A='...' ARGS_B='...' alternate-args.sh WORKLOAD POLICIES RATES RUNS OUT TREE_A TREE_B
#   -> OUT/<workload>-<a|b>-r<i>/results.json (side a = the change; the trees may be the same)
# Summaries: python bench/results/request-paced/sides.py OUT; python bench/results/untaught-prior/cells.py OUT
set -e
workload=$1 policies=$2 rates=$3 runs=$4 out=$5 a=$6 b=$7
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  for side in a b; do
    tree=$a; extra=$ARGS_A; [ "$side" = b ] && { tree=$b; extra=$ARGS_B; }
    (cd "$tree" && eval ".venv/bin/python -m bench --workload $workload --policies $policies --rates $rates \
      --repeat 1 --no-plots --out $out/$workload-$side-r$i $extra" > "$out/$workload-$side-r$i.log" 2>&1)
  done
done
