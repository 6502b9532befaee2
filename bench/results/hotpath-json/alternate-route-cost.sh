#!/bin/bash
# bench.route_cost alternated between two trees, four rounds: alternate-route-cost.sh TREE_A TREE_B
source "$(dirname "$0")/../../../.venv/bin/activate"
for i in 1 2 3 4; do
  for side in a:$1 b:$2; do
    (cd "${side#*:}" && python -m bench.route_cost --requests 200 2>&1 | grep -E "new question|agent step" | grep "|" | sed "s/^/${side%%:*}$i /")
  done
done
