#!/bin/bash
# usage: cell2.sh TREE NAME WORKLOAD RATES
cd /work/$1; source .venv/bin/activate
python -m bench --workload $3 --policies precise --rates $4 --repeat 1 --no-plots --out /tmp/s33/runs2/$2 > /tmp/s33/runs2/$2.log 2>&1
