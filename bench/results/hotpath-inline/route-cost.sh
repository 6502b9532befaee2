#!/bin/bash
# Router.route in one process, before (wt-base = c8d77b5) vs after (the working tree), alternated
source /work/main/.venv/bin/activate
for r in 1 2 3; do
 for t in wt-base main; do
  cd /work/$t && python -m bench.route_cost --requests 400 > /tmp/s31/rc/$t-$r.txt 2>&1
  echo "$t $r: $(grep 'agent step' /tmp/s31/rc/$t-$r.txt | tail -1)"
 done
done
