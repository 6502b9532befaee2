#!/bin/bash
for round in 3 4; do
  if [ $round = 3 ]; then order="b a"; else order="a b"; fi
  for t in $order; do /tmp/s33/cell.sh wt-$t $t-ag612-r$round agents 6,12; done
done
echo done > /tmp/s33/runs/CMP2_DONE
