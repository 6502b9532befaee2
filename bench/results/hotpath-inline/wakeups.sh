#!/bin/bash
# bench.extproc_floor with a 100K-token body; per processor, voluntary context switches (wake-ups) and CPU over
# the run, read from /proc while it runs. Usage: wakeups.sh TREE OUT
T=$1; OUT=$2; mkdir -p $OUT
cd $T; source .venv/bin/activate
MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864 python -m bench.extproc_floor --prompt-tokens 100000 --requests ${N:-200} > $OUT/floor.txt 2>&1 &
FP=$!
declare -A first last
while kill -0 $FP 2>/dev/null; do
  for kind in null-h2 authz null bare; do
    pid=$(pgrep -f -- "--serve $kind --port" | head -1)
    [ -z "$pid" ] && continue
    v=$(awk '/^voluntary_ctxt_switches/{print $2}' /proc/$pid/status 2>/dev/null)
    c=$(awk '{print $14+$15}' /proc/$pid/stat 2>/dev/null)
    [ -z "$v" ] && continue
    [ -z "${first[$kind]}" ] && first[$kind]="$v $c"
    last[$kind]="$v $c"
  done
  sleep 0.5
done
for kind in null-h2 authz null bare; do echo "$kind first ${first[$kind]} last ${last[$kind]}"; done > $OUT/switches.txt
cat $OUT/switches.txt
