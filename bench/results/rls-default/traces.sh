#!/bin/bash
# Tenants at 8 req/s from a fresh picker, traced under each learner, in pairs whose order alternates, plus two
# traces of sglang-router's cache_aware policy:  traces.sh TREE OUT [FIRST LAST]
# -> OUT/<learner>-<i>/trace-precise-8.jsonl, OUT/<learner>-<i>.log; then: python summary.py table OUT
tree=$1 out=$2 first=${3:-1} last=${4:-10}
mkdir -p "$out"; cd "$tree"
for i in 1 2; do
  .venv/bin/python -m bench.cell_trace --workload tenants --policy sglang_cache_aware --rates 8 --out "$out/sgl-$i" \
    > "$out/sgl-$i.log" 2>&1
done
for i in $(seq "$first" "$last"); do
  order="rls nlms"; [ $((i % 2)) -eq 0 ] && order="nlms rls"
  for l in $order; do
    .venv/bin/python -m bench.cell_trace --workload tenants --policy precise --rates 8 --out "$out/$l-$i" \
      --picker-set scheduling.cost_model.learner=$l > "$out/$l-$i.log" 2>&1
  done
done
