#!/bin/bash
# alternated base (wt-a) / change (wt-b), one benchmark at a time
for round in 1 2; do
  if [ $round = 1 ]; then order="b a"; else order="a b"; fi
  for t in $order; do /tmp/s33/cell.sh wt-$t $t-ag12-r$round agents 12; done
  for t in $order; do /tmp/s33/cell.sh wt-$t $t-ag612-r$round agents 6,12; done
  for t in $order; do /tmp/s33/cell.sh wt-$t $t-doc8-r$round documents 8; done
  for t in $order; do /tmp/s33/cell.sh wt-$t $t-moon8-r$round mooncake 8; done
  for t in $order; do /tmp/s33/cell.sh wt-$t $t-ten8-r$round tenants 8; done
done
echo done > /tmp/s33/runs/CMP_DONE
