#!/bin/bash
# bench.extproc_floor --prompt-tokens 100000: before (wt-a, e659447) vs SO_RCVLOWAT (wt-b), alternated
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="a b"; else order="b a"; fi
  for t in $order; do N=200 bench/results/hotpath-inline/wakeups.sh /work/wt-$t /tmp/s32/lowat-heap/$t$r > /dev/null 2>&1; done
done
echo done > /tmp/s32/lowat-heap/DONE
