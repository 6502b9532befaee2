#!/bin/bash
A=/work/main/bench/results/placement-window/alternate.sh
OUT=/tmp/s36/alt
$A mooncake 8,16 3 $OUT /work/wt-b /work/wt-a   # side a = wt-b (the change), side b = wt-a (base 7ed5b75)
$A tenants 8,24 2 $OUT /work/wt-b /work/wt-a   # side a = wt-b (the change), side b = wt-a (base 7ed5b75)
$A documents 8,16 1 $OUT /work/wt-b /work/wt-a   # side a = wt-b (the change), side b = wt-a (base 7ed5b75)
echo DONE
